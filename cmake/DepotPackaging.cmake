# `cpack -G DEB` (run in the build directory) makes one Debian package per
# install component of cmake/DepotInstall.cmake:
#   depot-server     depot-server and its systemd unit; creates the `depot`
#                    system user the unit runs as (deploy/debian/);
#   libdepot-client  libdepot_client.so.0 and everything to build against it:
#                    headers, CMake package, depot-client.pc.
# Both install under /usr, whatever CMAKE_INSTALL_PREFIX the build was
# configured with; runtime dependencies come from dpkg-shlibdeps.
set(CPACK_PACKAGE_NAME depot)
set(CPACK_PACKAGE_VENDOR "Depot")
set(CPACK_PACKAGE_CONTACT "Depot maintainers <depot@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Depot, a gRPC optimizer-state parameter server")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL server client)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_SERVER_PACKAGE_NAME depot-server)
set(CPACK_DEBIAN_SERVER_PACKAGE_SECTION net)
# adduser: the maintainer scripts create the `depot` user.
set(CPACK_DEBIAN_SERVER_PACKAGE_DEPENDS adduser)
set(CPACK_DEBIAN_SERVER_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/postinst
    ${PROJECT_SOURCE_DIR}/deploy/debian/prerm
    ${PROJECT_SOURCE_DIR}/deploy/debian/postrm)

set(CPACK_DEBIAN_CLIENT_PACKAGE_NAME libdepot-client)
set(CPACK_DEBIAN_CLIENT_PACKAGE_SECTION libdevel)
# The public headers include Abseil's, and depot-client.pc requires its .pc
# files; dpkg-shlibdeps adds the shared libraries.
set(CPACK_DEBIAN_CLIENT_PACKAGE_DEPENDS libabsl-dev)
# A shlibs file (only the client package has a library), so that packages
# built against the library depend on libdepot-client (>= this version).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

include(CPack)

cpack_add_component(server
  DISPLAY_NAME "depot-server"
  DESCRIPTION "The Depot server daemon and its systemd unit")
cpack_add_component(client
  DISPLAY_NAME "libdepot-client"
  DESCRIPTION "libdepot_client (C and C++ API), headers, CMake package and pkg-config file")
