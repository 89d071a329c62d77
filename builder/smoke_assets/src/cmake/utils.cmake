# Arch selection for k3smoke's kernels, in the shape of vLLM's cmake/utils.cmake: the same function
# names, signatures and semantics (written for this stand-in, not copied), so a tool that runs
# vLLM's helpers in CMake script mode (`cmake -P`) runs these the same way. Only functions: no
# project(), no targets, nothing that needs a configure step; including this file defines them.
# Like vLLM's, they use if(IN_LIST): a script that includes this file first says
# cmake_minimum_required(VERSION 3.26), as CMakeLists.txt does (policy CMP0057).


# TORCH_CUDA_ARCH_LIST ("8.0 9.0a 10.0 10.3f", spaces or semicolons) -> a CMake list of unique archs
# in ascending order, "+PTX" dropped as vLLM drops global PTX requests (warn_if_ptx_arch_requested):
# PTX is chosen per kernel.
function(k3_requested_cuda_archs OUT_ARCHS ARCH_LIST)
  string(REPLACE " " ";" _requested "${ARCH_LIST}")
  set(_archs)
  foreach(_arch IN LISTS _requested)
    if(_arch STREQUAL "")
      continue()
    endif()
    if(_arch MATCHES "\\+PTX$")
      message(WARNING "PTX requested through the arch list (${_arch}) is not kept: each kernel chooses its PTX")
      string(REPLACE "+PTX" "" _arch "${_arch}")
    endif()
    list(APPEND _archs "${_arch}")
  endforeach()
  list(REMOVE_DUPLICATES _archs)
  list(SORT _archs COMPARE NATURAL ORDER ASCENDING)
  set(${OUT_ARCHS} ${_archs} PARENT_SCOPE)
endfunction()

# The "loose intersection" of the archs a kernel supports (SRC_CUDA_ARCHS, "x.y", "x.ya", "x.yf",
# any of them with "+PTX") with the archs the build targets (TGT_CUDA_ARCHS), as vLLM defines it:
#   1. a suffixed source x.ya / x.yf is kept when the target list has x.y (and takes its place);
#   2. otherwise it becomes the target's own x.ya or x.yf when the target has one; a family
#      source x.yf also takes the first target of its major; an `a` source with no such target
#      is dropped: an sm_100a kernel gets no code for 10.3 unless 10.3 is targeted;
#   3. a suffixed target x.ya / x.yf whose x.y the source lists keeps its suffix;
#   4. every remaining target gets the highest remaining plain source <= it of the same major
#      (a "+PTX" source may serve a later major: its PTX is JIT-compiled forward);
#   5. "+PTX" goes back on the archs whose source asked for it.
# vLLM's example: SRC "7.5;8.0;8.6;9.0;9.0a", TGT "8.0;8.9;9.0" -> "9.0a;8.0;8.6".
function(cuda_archs_loose_intersection OUT_CUDA_ARCHS SRC_CUDA_ARCHS TGT_CUDA_ARCHS)
  set(_src)
  set(_ptx)
  foreach(_arch IN LISTS SRC_CUDA_ARCHS)
    if(_arch MATCHES "^(.+)\\+PTX$")
      list(APPEND _ptx "${CMAKE_MATCH_1}")
      set(_arch "${CMAKE_MATCH_1}")
    endif()
    list(APPEND _src "${_arch}")
  endforeach()
  list(REMOVE_DUPLICATES _src)
  set(_tgt ${TGT_CUDA_ARCHS})
  set(_out)

  # 1. exact base matches first, so a family source cannot take a target another source names.
  # (${CMAKE_MATCH_1} is expanded before if() matches, so the base is taken first.)
  foreach(_arch IN LISTS _src)
    string(REGEX REPLACE "[af]$" "" _base "${_arch}")
    if(NOT _base STREQUAL _arch AND _base IN_LIST _tgt)
      list(REMOVE_ITEM _tgt "${_base}")
      list(REMOVE_ITEM _src "${_arch}")
      list(APPEND _out "${_arch}")
    endif()
  endforeach()

  # 2. the remaining suffixed sources: the target's own suffix, or a family's first match.
  set(_plain)
  foreach(_arch IN LISTS _src)
    if(NOT _arch MATCHES "^(([0-9]+)\\.[0-9])([af])$")
      list(APPEND _plain "${_arch}")
      continue()
    endif()
    set(_base "${CMAKE_MATCH_1}")
    set(_major "${CMAKE_MATCH_2}")
    set(_suffix "${CMAKE_MATCH_3}")
    if("${_base}a" IN_LIST _tgt)
      list(REMOVE_ITEM _tgt "${_base}a")
      list(APPEND _out "${_base}a")
    elseif("${_base}f" IN_LIST _tgt)
      list(REMOVE_ITEM _tgt "${_base}f")
      list(APPEND _out "${_base}f")
    elseif(_suffix STREQUAL "f")
      foreach(_t IN LISTS _tgt)
        if(_t MATCHES "^${_major}\\.")
          list(REMOVE_ITEM _tgt "${_t}")
          list(APPEND _out "${_t}")
          break()
        endif()
      endforeach()
    endif()
  endforeach()
  set(_src ${_plain})

  # 3. suffixed targets keep their suffix when the source has their plain arch.
  foreach(_t IN LISTS TGT_CUDA_ARCHS)
    string(REGEX REPLACE "[af]$" "" _base "${_t}")
    if(_t IN_LIST _tgt AND NOT _base STREQUAL _t AND _base IN_LIST _src)
      list(REMOVE_ITEM _tgt "${_t}")
      list(REMOVE_ITEM _src "${_base}")
      list(APPEND _out "${_t}")
    endif()
  endforeach()

  # 4. loose matching of what is left, within a major unless the source is PTX.
  list(SORT _src COMPARE NATURAL ORDER ASCENDING)
  foreach(_t IN LISTS _tgt)
    string(REGEX MATCH "^[0-9]+" _t_major "${_t}")
    set(_best)
    foreach(_s IN LISTS _src)
      if(_s VERSION_GREATER _t)
        break()
      endif()
      string(REGEX MATCH "^[0-9]+" _s_major "${_s}")
      if(_s_major STREQUAL _t_major OR _s IN_LIST _ptx)
        set(_best "${_s}")
      endif()
    endforeach()
    if(_best)
      list(APPEND _out "${_best}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _out)

  # 5. "+PTX" back on.
  set(_final)
  foreach(_arch IN LISTS _out)
    if(_arch IN_LIST _ptx)
      list(APPEND _final "${_arch}+PTX")
    else()
      list(APPEND _final "${_arch}")
    endif()
  endforeach()
  set(${OUT_CUDA_ARCHS} ${_final} PARENT_SCOPE)
endfunction()

# SM 9.0-and-later kernels (vLLM: cuda_archs_sm90plus). The version gate is vLLM's: from CUDA 13
# on, family `f` lists, whose cubins load on every GPU of the family (sm_100f on 10.0 and 10.3);
# below 13, arch-specific `a` lists, so a Blackwell arch the build does not target gets no code.
# CMAKE_CUDA_COMPILER_VERSION is the CUDA the kernels are compiled with (CMakeLists.txt sets it, as
# CMake does for vLLM from nvcc; a script sets it itself).
function(cuda_archs_sm90plus OUT_CUDA_ARCHS TGT_CUDA_ARCHS)
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13.0)
    cuda_archs_loose_intersection(_archs "9.0a;10.0f;12.0f" "${TGT_CUDA_ARCHS}")
  else()
    cuda_archs_loose_intersection(_archs "9.0a;10.0a;10.3a;12.0a" "${TGT_CUDA_ARCHS}")
  endif()
  set(${OUT_CUDA_ARCHS} ${_archs} PARENT_SCOPE)
endfunction()
