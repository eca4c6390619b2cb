# loom_add_layer(NAME [INCLUDE dir...] [INTERNAL dir...] [BELOW layer...]): one layer of loom
# (runtime, kernels, backends, algorithms, graph, sim, parallel) as an OBJECT library `loom_<NAME>`.
#
# A layer sees its own headers (INCLUDE: installed public headers; INTERNAL: headers shared
# with the layers above it but never installed) and those of the layers it is BELOW-linked to,
# nothing else: an #include of a header from a layer above fails to compile. The shared library
# loom::loom is the union of the layers' objects (see the root CMakeLists.txt).
function(loom_add_layer name)
  cmake_parse_arguments(ARG "" "" "INCLUDE;INTERNAL;BELOW" ${ARGN})
  set(target loom_${name})
  add_library(${target} OBJECT)
  foreach(dir IN LISTS ARG_INCLUDE ARG_INTERNAL)
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/${dir}>)
  endforeach()
  foreach(dir IN LISTS ARG_INCLUDE)
    set_property(GLOBAL APPEND PROPERTY LOOM_PUBLIC_INCLUDE_DIRS ${CMAKE_CURRENT_SOURCE_DIR}/${dir})
  endforeach()
  foreach(below IN LISTS ARG_BELOW)
    target_link_libraries(${target} PUBLIC loom_${below})
  endforeach()
  target_compile_features(${target} PUBLIC cxx_std_20)
  # -Werror=switch: a switch over one of loom's enums that misses a value does not build.
  target_compile_options(${target} PRIVATE
                         $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror=switch>)
  set_property(GLOBAL APPEND PROPERTY LOOM_LAYERS ${target})
endfunction()
