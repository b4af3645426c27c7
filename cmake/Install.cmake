# Install rules (SAFECKPT_INSTALL, on when top level): the static libraries,
# public headers (include/safeckpt/*.hpp, the scanner's scan.hpp and the
# generated version.hpp, all under <prefix>/include/safeckpt/), the bundled
# allowlists (<prefix>/share/safeckpt/allowlist/*.allow, where the installed
# CLI looks for `--allow NAME`), the documentation (<prefix>/share/doc/safeckpt), the CMake package
# (<prefix>/lib/cmake/safeckpt: safeckpt::safeckpt, safeckpt::scanner,
# safeckpt::cuda when built) and safeckpt.pc. Included after GNUInstallDirs.
include(CMakePackageConfigHelpers)

set(SAFECKPT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/safeckpt)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/safeckpt ${PROJECT_SOURCE_DIR}/scanner/include/safeckpt
                  ${SAFECKPT_GENERATED_INCLUDE_DIR}/safeckpt
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
# Documentation (<prefix>/share/doc/safeckpt): the installed CLI's SARIF
# informationUri (README.md) and rules helpUri (scan.md = scanner/README.md)
# point here as file: URIs (cli/scan.cpp), and the inspect JSON schema.
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/inspect-json.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/scanner/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME scan.md)
file(GLOB _safeckpt_allow_files ${PROJECT_SOURCE_DIR}/allowlist/*.allow)
install(FILES ${_safeckpt_allow_files} DESTINATION ${SAFECKPT_INSTALL_ALLOWDIR})

if(TARGET safeckpt_cuda)
  set(SAFECKPT_HAS_CUDA TRUE)
else()
  set(SAFECKPT_HAS_CUDA FALSE)
endif()
get_property(_safeckpt_targets GLOBAL PROPERTY SAFECKPT_EXPORTED_TARGETS)
# Exported names drop the safeckpt_ prefix: safeckpt_util -> safeckpt::util,
# safeckpt_scanner -> safeckpt::scanner, safeckpt_cuda -> safeckpt::cuda;
# the aggregate `safeckpt` stays safeckpt::safeckpt.
foreach(t IN LISTS _safeckpt_targets)
  if(NOT t STREQUAL "safeckpt")
    string(REGEX REPLACE "^safeckpt_" "" _name ${t})
    set_target_properties(${t} PROPERTIES EXPORT_NAME ${_name})
  endif()
endforeach()
install(TARGETS ${_safeckpt_targets} EXPORT safeckptTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET safeckpt_cli)
  install(TARGETS safeckpt_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT safeckptTargets NAMESPACE safeckpt:: DESTINATION ${SAFECKPT_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/safeckptConfig.cmake.in
  ${PROJECT_BINARY_DIR}/safeckptConfig.cmake
  INSTALL_DESTINATION ${SAFECKPT_INSTALL_CMAKEDIR}
  PATH_VARS SAFECKPT_INSTALL_ALLOWDIR)
# 0.x: only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/safeckptConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/safeckptConfig.cmake ${PROJECT_BINARY_DIR}/safeckptConfigVersion.cmake
        DESTINATION ${SAFECKPT_INSTALL_CMAKEDIR})

# pkg-config: every static library in link order (users first).
set(SAFECKPT_PC_LIBS "-lsafeckpt_scanner -lsafeckpt_safetensors -lsafeckpt_save -lsafeckpt_checkpoint")
string(APPEND SAFECKPT_PC_LIBS " -lsafeckpt_container -lsafeckpt_torch -lsafeckpt_allowlist_data")
string(APPEND SAFECKPT_PC_LIBS " -lsafeckpt_pickle -lsafeckpt_util")
file(RELATIVE_PATH SAFECKPT_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${PROJECT_SOURCE_DIR}/cmake/safeckpt.pc.in ${PROJECT_BINARY_DIR}/safeckpt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/safeckpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
