// The preload's `dlsym`: asks tide_dlsym_replacement (real_dlsym.cpp) for a hook, and when it
// declines (null), *jumps* to glibc's dlsym with the caller's arguments and return address
// intact; (void*)-1 means "answer NULL".
//
// Why a jump: glibc resolves dlsym(RTLD_NEXT, name) relative to the object its return address
// lies in. A C wrapper calling glibc's dlsym would make every RTLD_NEXT lookup in the process
// (sanitizer runtimes, other interposers, malloc wrappers) search from the preload's place
// instead of the caller's, and could hand a wrapper its own function back.
#if defined(__x86_64__)
        .text
        .globl  dlsym
        .type   dlsym, @function
        .p2align 4
dlsym:
        .cfi_startproc
        endbr64
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp                  // 16-byte alignment at the call
        .cfi_adjust_cfa_offset 8
        call    tide_dlsym_replacement
        addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testq   %rax, %rax
        jz      1f
        cmpq    $-1, %rax                 // "not found": dlsym returns NULL (dlerror is set)
        je      2f
        ret
1:
        jmpq    *tide_real_dlsym_fn(%rip)  // set before tide_dlsym_replacement returns
2:
        xorl    %eax, %eax
        ret
        .cfi_endproc
        .size   dlsym, .-dlsym
#endif
        .section .note.GNU-stack,"",@progbits
