# ctest package.install_consume (label package):
#   1. cmake --install the current build tree into a temporary prefix;
#   2. configure + build tests/package/consumer against it with
#      find_package(safeckpt CONFIG REQUIRED), run it on a corpus file and
#      compare its tensor count / verdict / findings with the installed CLI's
#      `inspect` and `scan --format json` output (a clean and a malicious
#      file); the installed CLI finds the
#      bundled `--allow argparse` under <prefix>/share; pkg-config reads
#      safeckpt.pc;
#   3. configure tests/package/subproject (add_subdirectory of the source tree)
#      with CLI11_DIR/fmt_DIR/benchmark_DIR pointing at configs that fail if searched.
# Inputs: -DBUILD=<build dir> -DSOURCE=<source dir> -DWORK=<scratch dir>
#         -DGENERATOR=... -DCXX=<compiler> -DFILE=<corpus file>
#         -DBAD_FILE=<malicious corpus file>
#         -DALLOW_FILE=<corpus file needing argparse.allow>
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()
function(expect what got want)
  if(NOT "${got}" STREQUAL "${want}")
    message(FATAL_ERROR "${what}: got '${got}', expected '${want}'")
  endif()
  message(STATUS "${what}: ${got}")
endfunction()

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
foreach(f include/safeckpt/checkpoint.hpp include/safeckpt/scan.hpp include/safeckpt/version.hpp
          share/safeckpt/allowlist/numpy.allow lib/cmake/safeckpt/safeckptConfig.cmake
          lib/cmake/safeckpt/safeckptConfigVersion.cmake lib/pkgconfig/safeckpt.pc bin/safeckpt)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()

# 2. find_package consumer.
run(${CMAKE_COMMAND} -S ${SOURCE}/tests/package/consumer -B ${WORK}/consumer -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${WORK}/consumer/consumer ${FILE})
string(REGEX MATCH "version=([0-9.]+)" _ "${out}")
run(${prefix}/bin/safeckpt --version)
expect("safeckpt --version vs SAFECKPT_VERSION_STRING" "${out}" "safeckpt ${CMAKE_MATCH_1}\n")

# SARIF says where the tool and its rules are documented: the installed docs
# as file: URIs (no public project URL exists; SAFECKPT_PROJECT_URL overrides).
get_filename_component(_real_prefix ${prefix} REALPATH)
execute_process(COMMAND ${prefix}/bin/safeckpt scan --format sarif ${FILE} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
string(JSON info GET "${out}" runs 0 tool driver informationUri)
string(JSON help GET "${out}" runs 0 tool driver rules 0 helpUri)
if(NOT info MATCHES "^https?://")
  expect("SARIF informationUri (installed README.md)" "${info}" "file://${_real_prefix}/share/doc/safeckpt/README.md")
  expect("SARIF helpUri (installed scan.md)" "${help}" "file://${_real_prefix}/share/doc/safeckpt/scan.md")
endif()
foreach(f share/doc/safeckpt/README.md share/doc/safeckpt/scan.md share/doc/safeckpt/inspect-json.md)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()

# A clean file (loaded: tensor count vs inspect) and a malicious one
# (refused: findings vs scan).
foreach(f ${FILE} ${BAD_FILE})
  run(${WORK}/consumer/consumer ${f})
  set(consumer_out "${out}")
  message(STATUS "consumer ${f}:\n${consumer_out}")
  string(REGEX MATCH "allowlist_numpy=([01])" _ "${consumer_out}")
  expect("consumer sees safeckpt_ALLOWLIST_DIR/numpy.allow" "${CMAKE_MATCH_1}" 1)
  string(REGEX MATCH "verdict=([a-z_]+)" _ "${consumer_out}")
  set(c_verdict ${CMAKE_MATCH_1})
  string(REGEX MATCH "findings=([0-9]+)" _ "${consumer_out}")
  set(c_findings ${CMAKE_MATCH_1})
  if(f STREQUAL BAD_FILE AND NOT consumer_out MATCHES "refused=disallowed_global")
    message(FATAL_ERROR "the consumer loaded ${f}")
  endif()
  if(consumer_out MATCHES "tensors=([0-9]+)")
    set(c_tensors ${CMAKE_MATCH_1})
    run(${prefix}/bin/safeckpt inspect ${f})
    string(REGEX MATCH "total: ([0-9]+) named tensors" _ "${out}")
    expect("tensors (consumer vs CLI inspect)" "${c_tensors}" "${CMAKE_MATCH_1}")
  endif()
  execute_process(COMMAND ${prefix}/bin/safeckpt scan --format json ${f} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  string(JSON cli_verdict GET "${out}" files 0 verdict)
  string(JSON cli_findings LENGTH "${out}" files 0 findings)
  expect("verdict (consumer vs CLI scan)" "${c_verdict}" "${cli_verdict}")
  expect("findings (consumer vs CLI scan)" "${c_findings}" "${cli_findings}")
endforeach()

# The installed CLI finds bundled allowlists by name under <prefix>/share.
run(${prefix}/bin/safeckpt inspect --allow argparse ${ALLOW_FILE})
message(STATUS "installed CLI: --allow argparse found <prefix>/share/safeckpt/allowlist/argparse.allow")

# pkg-config, when installed here.
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
  run(${PKG_CONFIG} --libs --cflags safeckpt)
  string(REGEX MATCH "-I([^ ]+)" _ "${out}")
  file(REAL_PATH "${CMAKE_MATCH_1}" inc)
  if(NOT inc STREQUAL "${prefix}/include" OR NOT out MATCHES " -lsafeckpt_scanner .*-lsafeckpt_util")
    message(FATAL_ERROR "safeckpt.pc: unexpected flags: ${out}")
  endif()
  message(STATUS "pkg-config: ${out}")
endif()

# 3. As a subproject: configure only (building the libraries again would take
# minutes on CI's 2 cores; the consumer above links the same code).
run(${CMAKE_COMMAND} -S ${SOURCE}/tests/package/subproject -B ${WORK}/subproject -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DSAFECKPT_SOURCE=${SOURCE} -DSAFECKPT_CUDA=OFF
    -DCLI11_DIR=${SOURCE}/tests/package/poison -Dbenchmark_DIR=${SOURCE}/tests/package/poison
    -Dfmt_DIR=${SOURCE}/tests/package/poison)
message(STATUS "subproject: configured without CLI11/fmt/benchmark, build type untouched")
