# Warnings every tide target is built with, and the helper that declares a component library.
add_library(tide_warnings INTERFACE)
target_compile_options(tide_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
   -Werror=return-type -Werror=unused-result>)

# tide_component(NAME src...): a static library tide_NAME whose sources include headers as
# "folder/file.h" from the project root, linked whole into libtide.so.
function(tide_component name)
  add_library(tide_${name} STATIC ${ARGN})
  target_include_directories(tide_${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(tide_${name} PUBLIC tide_warnings)
  set_property(GLOBAL APPEND PROPERTY TIDE_COMPONENTS tide_${name})
endfunction()
