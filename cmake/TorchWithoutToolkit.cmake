# libtorch's `torch` target made from its libraries alone, where a CUDA
# libtorch (the default wheel) meets a machine with no CUDA toolkit: torch's
# own CMake package (Caffe2Config.cmake) stops there, though neither
# zero-cpp's CPU side nor a project using it compiles CUDA code. Used by
# zero-cpp's own build (a CPU-only `pip install .` on a machine without the
# toolkit) and, installed beside it, by zeroConfig.cmake for projects that
# use zero-cpp.
#
#   zero_torch_needs_stand_in(<out> <torch prefix>)   TRUE where torch is a CUDA build and no toolkit is found
#   zero_torch_package_facts(<torch prefix> <definitions out> <cudart out> <cxx flags out>)
#   zero_torch_stand_in(<torch prefix> <definitions> <cudart> <cxx flags>)
#                                                     the `torch` and CUDA::cudart targets, and the
#                                                     variables find_package(Torch) sets

# The very test torch's package makes (its FindCUDA).
function(zero_torch_needs_stand_in out prefix)
  set(${out} FALSE PARENT_SCOPE)
  if(NOT EXISTS "${prefix}/lib/libtorch_cuda.so")
    return()
  endif()
  list(APPEND CMAKE_MODULE_PATH "${prefix}/share/cmake/Caffe2/Modules_CUDA_fix")
  find_package(CUDA QUIET)
  if(NOT CUDA_FOUND)
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

# What torch's own targets would carry, read from its package's files: the
# compile definitions of torch_cpu and torch_cuda, and the CUDA runtime the
# wheel ships (of the CUDA major torch was built with, when its package
# says).
function(zero_torch_package_facts prefix definitions_out cudart_out cxx_flags_out)
  set(defs "")
  file(READ "${prefix}/share/cmake/Caffe2/Caffe2Targets.cmake" targets)
  foreach(t torch_cpu torch_cuda)
    if(targets MATCHES "set_target_properties\\(${t} PROPERTIES[^)]*INTERFACE_COMPILE_DEFINITIONS \"([^\"$]*)\"")
      list(APPEND defs ${CMAKE_MATCH_1})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES defs)
  set(${definitions_out} "${defs}" PARENT_SCOPE)
  file(GLOB cudart "${prefix}/../nvidia/*/lib/libcudart.so.[0-9]*" "${prefix}/lib/libcudart*.so*")
  set(first "")
  if(cudart)
    list(GET cudart 0 first)
  endif()
  set(${cudart_out} "${first}" PARENT_SCOPE)
  # The C++ ABI flag older wheels required (2.11's package sets none).
  file(READ "${prefix}/share/cmake/Torch/TorchConfig.cmake" config)
  set(flags "")
  if(config MATCHES "set\\(TORCH_CXX_FLAGS \"([^\"]*)\"\\)")
    set(flags "${CMAKE_MATCH_1}")
  endif()
  set(${cxx_flags_out} "${flags}" PARENT_SCOPE)
endfunction()

macro(zero_torch_stand_in prefix definitions cudart cxx_flags)
  set(_zero_torch_lib "${prefix}/lib")
  if(NOT TARGET torch)
    add_library(torch INTERFACE IMPORTED)
    set_property(TARGET torch PROPERTY ZERO_TORCH_WITHOUT_TOOLKIT TRUE)
    set_target_properties(torch PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${prefix}/include;${prefix}/include/torch/csrc/api/include"
      INTERFACE_COMPILE_DEFINITIONS "${definitions}"
      INTERFACE_COMPILE_OPTIONS "${cxx_flags}"
      # As torch's own targets: torch_cpu and torch_cuda stay needed even
      # where nothing names their symbols (their operators register at load).
      INTERFACE_LINK_LIBRARIES "-Wl,--no-as-needed,${_zero_torch_lib}/libtorch_cpu.so,${_zero_torch_lib}/libtorch_cuda.so,--as-needed;${_zero_torch_lib}/libtorch.so;${_zero_torch_lib}/libc10_cuda.so;${_zero_torch_lib}/libc10.so")
  endif()
  if(NOT TARGET CUDA::cudart AND EXISTS "${cudart}")
    add_library(CUDA::cudart SHARED IMPORTED)
    set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${cudart}")
  endif()
  set(Torch_FOUND TRUE)
  set(TORCH_LIBRARIES torch)
  set(TORCH_INCLUDE_DIRS "${prefix}/include;${prefix}/include/torch/csrc/api/include")
  set(TORCH_INSTALL_PREFIX "${prefix}")
  set(TORCH_CXX_FLAGS "${cxx_flags}")
endmacro()
