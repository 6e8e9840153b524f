// The stack switch of kernels/host/fiber.cpp on x86-64 (System V ABI); built on x86-64 only
// (kernels/CMakeLists.txt). Other architectures use ucontext.

        .text

// void tide_fiber_switch(void** save_sp, void* load_sp)
// Pushes what the ABI says a call preserves (rbp, rbx, r12-r15, the MXCSR and x87 control
// words), stores the stack pointer to *save_sp, takes load_sp as the stack pointer, and pops the
// same from there: the call returns in the context that load_sp was saved from.
        .globl  tide_fiber_switch
        .hidden tide_fiber_switch
        .type   tide_fiber_switch, @function
tide_fiber_switch:
        .cfi_startproc
        pushq   %rbp
        .cfi_adjust_cfa_offset 8
        pushq   %rbx
        .cfi_adjust_cfa_offset 8
        pushq   %r12
        .cfi_adjust_cfa_offset 8
        pushq   %r13
        .cfi_adjust_cfa_offset 8
        pushq   %r14
        .cfi_adjust_cfa_offset 8
        pushq   %r15
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp
        .cfi_adjust_cfa_offset 8
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %r15
        .cfi_adjust_cfa_offset -8
        popq    %r14
        .cfi_adjust_cfa_offset -8
        popq    %r13
        .cfi_adjust_cfa_offset -8
        popq    %r12
        .cfi_adjust_cfa_offset -8
        popq    %rbx
        .cfi_adjust_cfa_offset -8
        popq    %rbp
        .cfi_adjust_cfa_offset -8
        ret
        .cfi_endproc
        .size   tide_fiber_switch, .-tide_fiber_switch

// A new fiber's first return address (fiber.cpp builds the frame): calls r12 with r13 as its
// argument. That function never returns. No caller above: unwinders stop here.
        .globl  tide_fiber_trampoline
        .hidden tide_fiber_trampoline
        .type   tide_fiber_trampoline, @function
tide_fiber_trampoline:
        .cfi_startproc
        .cfi_undefined rip
        movq    %r13, %rdi
        callq   *%r12
        ud2
        .cfi_endproc
        .size   tide_fiber_trampoline, .-tide_fiber_trampoline

        .section .note.GNU-stack, "", @progbits
