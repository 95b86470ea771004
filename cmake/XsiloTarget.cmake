# Warnings, sanitizers and the include root, applied to every xsilo target.
add_library(xsilo_options INTERFACE)
target_include_directories(xsilo_options INTERFACE ${PROJECT_SOURCE_DIR})
target_compile_options(xsilo_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
  # GCC 12 reports std::variant and std::optional members as "maybe uninitialized" at -O2
  # (GCC bug 105562 and friends): false positives that would break -Werror builds.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${XSILO_WERROR}>>:-Werror>)
target_compile_definitions(xsilo_options INTERFACE
  BOOST_ASIO_NO_DEPRECATED XSILO_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
if(XSILO_NATIVE)
  target_compile_options(xsilo_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()
if(XSILO_SANITIZE)
  target_compile_options(xsilo_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(xsilo_options INTERFACE -fsanitize=address,undefined)
endif()

# xsilo_library(NAME SOURCES... DEPS ...)
function(xsilo_library name)
  cmake_parse_arguments(X "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${X_SOURCES})
  target_link_libraries(${name} PUBLIC xsilo_options ${X_DEPS})
endfunction()
