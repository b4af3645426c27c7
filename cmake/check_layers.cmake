# Layers one way: fails when a file includes a header of a higher layer.
#   cmake -DROOT=<source dir> -P cmake/check_layers.cmake
# Run at configure time (CMakeLists.txt includes cmake/CheckLayers.cmake) and
# as the ctest test layers.includes. The order is defined here, once:
#
#   util < container < pickle < torch < checkpoint < save < safetensors < dcp < graph < enginecache
#        < open < sign < scanner < cuda < engine < cli < python (the Python package's native module)
#
# plus two rules the order alone does not say:
#   - the safetensors reader (src/safetensors/safetensors.cpp, internal.hpp
#     and include/safeckpt/safetensors_reader.hpp) reaches no save-layer
#     header, directly or through the headers it includes (it builds
#     Checkpoints, it does not save): safetensors_writer.hpp and the
#     compatibility safetensors.hpp include save.hpp, so the reader names
#     neither;
#   - the shipped CLI (cli/) includes nothing from bench/: a quoted include
#     there is either safeckpt/... or a file in cli/.
# A header's layer: include/safeckpt/<name>.hpp by the table below, an
# internal "<layer>/x.hpp" by its folder.
cmake_policy(SET CMP0057 NEW)  # if(... IN_LIST ...) in script mode
if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P check_layers.cmake")
endif()

set(_order util container pickle torch checkpoint save safetensors dcp graph enginecache open sign scanner cuda engine cli python)
set(_hdr_util error dtype mapped_file limits hash version)
set(_hdr_container zip detect)
set(_hdr_pickle pickle value)
set(_hdr_torch allowlist tensor)
set(_hdr_checkpoint checkpoint json builder)
set(_hdr_save save)
# safetensors.hpp: compatibility header = reader + writer.
set(_hdr_safetensors safetensors safetensors_reader safetensors_writer)
set(_hdr_graph graph graph_plan)
set(_hdr_enginecache compile_cache)
set(_hdr_dcp dcp)
set(_hdr_open open)
set(_hdr_sign sign)
set(_hdr_scanner scan)
set(_hdr_cuda cuda dlpack device_checkpoint)
set(_hdr_engine engine)

function(_rank layer out)
  list(FIND _order ${layer} r)
  set(${out} ${r} PARENT_SCOPE)
endfunction()

# Map every public header name to its layer.
foreach(layer IN LISTS _order)
  foreach(h IN LISTS _hdr_${layer})
    set(_layer_of_${h} ${layer})
  endforeach()
endforeach()

# Files and the layer they belong to.
set(_files)
foreach(layer util container pickle torch checkpoint save safetensors dcp graph enginecache open sign cuda engine)
  file(GLOB _f ${ROOT}/src/${layer}/*.cpp ${ROOT}/src/${layer}/*.hpp ${ROOT}/src/${layer}/*.cu)
  foreach(f IN LISTS _f)
    list(APPEND _files "${layer}|${f}")
  endforeach()
endforeach()
file(GLOB _f ${ROOT}/include/safeckpt/*.hpp ${ROOT}/scanner/include/safeckpt/*.hpp)
foreach(f IN LISTS _f)
  get_filename_component(n ${f} NAME_WE)
  if(NOT DEFINED _layer_of_${n})
    message(SEND_ERROR "layers: public header ${f} has no layer: add it to cmake/check_layers.cmake")
    continue()
  endif()
  list(APPEND _files "${_layer_of_${n}}|${f}")
endforeach()
file(GLOB _f ${ROOT}/scanner/src/*.cpp ${ROOT}/scanner/src/*.hpp)
foreach(f IN LISTS _f)
  list(APPEND _files "scanner|${f}")
endforeach()
file(GLOB _f ${ROOT}/cli/*.cpp ${ROOT}/cli/*.hpp)
foreach(f IN LISTS _f)
  list(APPEND _files "cli|${f}")
endforeach()
file(GLOB _f ${ROOT}/python/src/*.cpp ${ROOT}/python/src/*.hpp)
foreach(f IN LISTS _f)
  list(APPEND _files "python|${f}")
endforeach()

set(_bad 0)
foreach(entry IN LISTS _files)
  string(REPLACE "|" ";" entry "${entry}")
  list(GET entry 0 layer)
  list(GET entry 1 f)
  _rank(${layer} rank)
  file(STRINGS ${f} _incs REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS _incs)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc "${line}")
    set(target_layer "")
    if(inc MATCHES "^safeckpt/([A-Za-z0-9_]+)\\.hpp$")
      set(target_layer ${_layer_of_${CMAKE_MATCH_1}})
      if(target_layer STREQUAL "")
        message(SEND_ERROR "layers: ${f} includes unknown public header ${inc}")
        math(EXPR _bad "${_bad} + 1")
        continue()
      endif()
    elseif(inc MATCHES "^([a-z_]+)/")
      set(target_layer ${CMAKE_MATCH_1})
    endif()
    if(layer STREQUAL "cli" AND NOT inc MATCHES "^safeckpt/")
      get_filename_component(dir ${f} DIRECTORY)
      if(NOT EXISTS ${dir}/${inc})
        message(SEND_ERROR "layers: ${f} includes \"${inc}\", not a cli/ or safeckpt/ header (bench/ headers stay out of the shipped CLI)")
        math(EXPR _bad "${_bad} + 1")
      endif()
      continue()
    endif()
    if(target_layer STREQUAL "")
      continue()  # a header beside the file (scanner/src/catalogue.hpp ...)
    endif()
    _rank(${target_layer} trank)
    if(trank EQUAL -1)
      message(SEND_ERROR "layers: ${f} includes \"${inc}\" from outside the layers")
      math(EXPR _bad "${_bad} + 1")
    elseif(trank GREATER rank)
      message(SEND_ERROR "layers: ${f} (${layer}) includes \"${inc}\" (${target_layer}): upward include")
      math(EXPR _bad "${_bad} + 1")
    endif()
  endforeach()
endforeach()
# The safetensors reader reaches no save-layer header: follow its quoted
# includes (safeckpt/X.hpp in include/ or scanner/include/, layer/x.hpp in
# src/, or a header beside the file) transitively.
set(_reader_files ${ROOT}/src/safetensors/safetensors.cpp ${ROOT}/src/safetensors/internal.hpp
                  ${ROOT}/include/safeckpt/safetensors_reader.hpp)
foreach(start IN LISTS _reader_files)
  if(NOT EXISTS ${start})
    continue()
  endif()
  set(_todo ${start})
  set(_seen ${start})
  while(_todo)
    list(POP_FRONT _todo f)
    get_filename_component(dir ${f} DIRECTORY)
    file(STRINGS ${f} _incs REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line IN LISTS _incs)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc "${line}")
      set(hdr_layer "")
      if(inc MATCHES "^safeckpt/([A-Za-z0-9_]+)\\.hpp$")
        set(hdr_layer "${_layer_of_${CMAKE_MATCH_1}}")  # CMAKE_MATCH_1 is set only after MATCHES ran
      endif()
      if(hdr_layer STREQUAL "save")
        message(SEND_ERROR "layers: the safetensors reader ${start} reaches \"${inc}\" (save layer) through ${f}")
        math(EXPR _bad "${_bad} + 1")
        continue()
      endif()
      set(next "")
      foreach(cand ${ROOT}/include/${inc} ${ROOT}/scanner/include/${inc} ${ROOT}/src/${inc} ${dir}/${inc})
        if(next STREQUAL "" AND EXISTS ${cand})
          set(next ${cand})
        endif()
      endforeach()
      if(NOT next STREQUAL "" AND NOT next IN_LIST _seen)
        list(APPEND _seen ${next})
        list(APPEND _todo ${next})
      endif()
    endforeach()
  endwhile()
endforeach()

if(_bad GREATER 0)
  message(FATAL_ERROR "layers: ${_bad} upward include(s); the order is in cmake/check_layers.cmake")
endif()
