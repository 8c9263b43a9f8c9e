# The installed package: headers, libraries and a CMake package config, so that another project
# can write
#
#   find_package(troupe CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE troupe::troupe)   # or troupe::tensors, troupe::ddp, ...
#
# troupe_install_layer(<target> <export-name> <include-dir>) exports a layer library as
# troupe::<export-name> and installs its public headers; troupe_install_package() writes the
# config (after every layer is declared). The config finds the dependencies the libraries link:
# Threads, CAF (through the FindCAF.cmake installed beside it), Boost.Serialization, BLAS and,
# in a CUDA build, the CUDA toolkit.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TROUPE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/troupe")

function(troupe_install_layer target export_name include_dir)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  install(TARGETS ${target} EXPORT troupe-targets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(DIRECTORY "${include_dir}/" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()

function(troupe_install_package)
  # Helper targets that static layer libraries link privately travel with the export set.
  foreach(helper troupe_cblas troupe_nccl)
    if(TARGET ${helper})
      string(REPLACE "troupe_" "" name ${helper})
      set_target_properties(${helper} PROPERTIES EXPORT_NAME ${name})
      install(TARGETS ${helper} EXPORT troupe-targets)
    endif()
  endforeach()
  install(EXPORT troupe-targets NAMESPACE troupe:: FILE troupeTargets.cmake
    DESTINATION ${TROUPE_INSTALL_CMAKEDIR})
  set(TROUPE_WITH_NCCL_BOOL OFF)
  if(TROUPE_WITH_NCCL)
    set(TROUPE_WITH_NCCL_BOOL ON)
  endif()
  configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/troupeConfig.cmake.in"
    "${PROJECT_BINARY_DIR}/troupeConfig.cmake"
    INSTALL_DESTINATION ${TROUPE_INSTALL_CMAKEDIR})
  write_basic_package_version_file("${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake"
    COMPATIBILITY SameMinorVersion)
  install(FILES "${PROJECT_BINARY_DIR}/troupeConfig.cmake" "${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake"
    "${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake"
    DESTINATION ${TROUPE_INSTALL_CMAKEDIR})
endfunction()
