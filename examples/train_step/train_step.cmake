# loom_train_step: the MLP training step (model, graph, shared flags), used by
# the train_step example, loom-overlap and their tests. Included from both folders; defined once.
include_guard(GLOBAL)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(OPENBLAS QUIET IMPORTED_TARGET openblas)
endif()
find_package(Boost 1.74 QUIET COMPONENTS program_options)
if(NOT OPENBLAS_FOUND OR NOT Boost_PROGRAM_OPTIONS_FOUND)
  message(STATUS "loom: train_step example and loom-overlap skipped (need OpenBLAS: "
                 "apt-get install libopenblas-dev, and Boost.program_options)")
  return()
endif()
set(dir ${PROJECT_SOURCE_DIR}/examples/train_step)
add_library(loom_train_step STATIC ${dir}/mlp.cpp ${dir}/train_step.cpp
            ${dir}/train_options.cpp)
target_include_directories(loom_train_step PUBLIC ${dir})
target_compile_options(loom_train_step PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>)
target_link_libraries(loom_train_step PUBLIC loom::loom PkgConfig::OPENBLAS Boost::program_options
                                             TBB::tbb)
# With CUDA, the same step can run its model on a GPU (cuBLAS; --device cuda).
if(LOOM_HAVE_CUDA AND TARGET CUDA::cublas)
  target_sources(loom_train_step PRIVATE ${dir}/cuda_mlp.cu)
  target_link_libraries(loom_train_step PUBLIC CUDA::cublas CUDA::cudart)
  target_compile_definitions(loom_train_step PUBLIC LOOM_TRAIN_STEP_CUDA=1)
endif()
