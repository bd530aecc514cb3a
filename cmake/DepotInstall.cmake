# What `cmake --install` puts under the prefix, in two components (the .deb
# packages of cmake/DepotPackaging.cmake follow them; docs/packaging.md):
#   client  libdepot_client.so.0.1.0 with its links, the public headers, the
#           CMake package (find_package(depot) -> depot::client) and
#           depot-client.pc;
#   server  depot-server and its systemd unit.
include(CMakePackageConfigHelpers)

set(DEPOT_CMAKE_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/depot)
set(DEPOT_SYSTEMD_UNIT_DIR lib/systemd/system CACHE STRING
    "Where the systemd unit is installed, relative to the install prefix")

# Installs `file` into `destination` (relative to the prefix) with every
# @DEPOT_INSTALL_PREFIX@ in it replaced by the prefix the install step writes
# to. `cmake --install --prefix` and CPack choose that prefix only then, so the
# absolute paths of a .pc file or a systemd unit cannot be written at
# configure time.
function(depot_install_with_prefix file destination component)
  get_filename_component(name ${file} NAME)
  install(CODE "
    file(READ \"${file}\" contents)
    string(REPLACE \"@DEPOT_INSTALL_PREFIX@\" \"\${CMAKE_INSTALL_PREFIX}\"
           contents \"\${contents}\")
    # One staging file per destination, so that two installs to different
    # prefixes at once do not write the same file.
    string(MD5 staging \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}\")
    set(staged \"${CMAKE_BINARY_DIR}/install-with-prefix/\${staging}/${name}\")
    file(WRITE \"\${staged}\" \"\${contents}\")
    file(INSTALL \"\${staged}\"
         DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${destination}\")
  " COMPONENT ${component})
endfunction()

# A path of GNUInstallDirs (relative to the prefix, or absolute) as it must
# appear in a file installed with depot_install_with_prefix.
function(depot_installed_path out relative)
  if(IS_ABSOLUTE "${relative}")
    set(${out} "${relative}" PARENT_SCOPE)
  else()
    set(${out} "@DEPOT_INSTALL_PREFIX@/${relative}" PARENT_SCOPE)
  endif()
endfunction()

# ---------------------------------------------------------------- client
install(TARGETS depot_client EXPORT depotTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    COMPONENT client NAMELINK_COMPONENT client
  FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT client)
# The CUDA backend, beside the client that loads it (client/src/gpu/
# cuda_backend.h): a runtime file only, no headers, no link name.
if(TARGET depot_cuda)
  install(TARGETS depot_cuda
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
      COMPONENT client NAMELINK_SKIP)
endif()
install(EXPORT depotTargets
  NAMESPACE depot::
  DESTINATION ${DEPOT_CMAKE_PACKAGE_DIR}
  COMPONENT client)
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/depotConfig.cmake.in
  ${CMAKE_BINARY_DIR}/depotConfig.cmake
  INSTALL_DESTINATION ${DEPOT_CMAKE_PACKAGE_DIR})
# SameMajorVersion: the major version is the SONAME's (client/CMakeLists.txt).
write_basic_package_version_file(
  ${CMAKE_BINARY_DIR}/depotConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES
  ${CMAKE_BINARY_DIR}/depotConfig.cmake
  ${CMAKE_BINARY_DIR}/depotConfigVersion.cmake
  DESTINATION ${DEPOT_CMAKE_PACKAGE_DIR}
  COMPONENT client)

# The prefix stays a token here; depot_install_with_prefix fills it in.
set(DEPOT_INSTALL_PREFIX "@DEPOT_INSTALL_PREFIX@")
depot_installed_path(DEPOT_PC_LIBDIR ${CMAKE_INSTALL_LIBDIR})
depot_installed_path(DEPOT_PC_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR})
configure_file(${CMAKE_CURRENT_LIST_DIR}/depot-client.pc.in
               ${CMAKE_BINARY_DIR}/depot-client.pc @ONLY)
depot_install_with_prefix(${CMAKE_BINARY_DIR}/depot-client.pc
                          ${CMAKE_INSTALL_LIBDIR}/pkgconfig client)

# ---------------------------------------------------------------- server
install(TARGETS depot-server depotctl
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT server)

# deploy/systemd/depot-server.service, with ExecStart pointing at the
# installed binary (the file in deploy/ names /usr/local/bin, for a copy by
# hand).
set(DEPOT_UNIT ${PROJECT_SOURCE_DIR}/deploy/systemd/depot-server.service)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${DEPOT_UNIT})
file(READ ${DEPOT_UNIT} DEPOT_UNIT_TEXT)
set(DEPOT_UNIT_EXEC "ExecStart=/usr/local/bin/depot-server")
string(FIND "${DEPOT_UNIT_TEXT}" "${DEPOT_UNIT_EXEC}" DEPOT_UNIT_EXEC_AT)
if(DEPOT_UNIT_EXEC_AT EQUAL -1)
  message(FATAL_ERROR "${DEPOT_UNIT} has no line '${DEPOT_UNIT_EXEC}' for "
                      "cmake/DepotInstall.cmake to point at the installed binary")
endif()
depot_installed_path(DEPOT_INSTALLED_BINDIR ${CMAKE_INSTALL_BINDIR})
string(REPLACE "${DEPOT_UNIT_EXEC}"
       "ExecStart=${DEPOT_INSTALLED_BINDIR}/depot-server"
       DEPOT_UNIT_TEXT "${DEPOT_UNIT_TEXT}")
file(WRITE ${CMAKE_BINARY_DIR}/depot-server.service "${DEPOT_UNIT_TEXT}")
depot_install_with_prefix(${CMAKE_BINARY_DIR}/depot-server.service
                          ${DEPOT_SYSTEMD_UNIT_DIR} server)
