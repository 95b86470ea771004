# Install rules and the Debian package: `cpack -G DEB` in a build folder writes
# xsilo_<version>_amd64.deb (scripts/package.sh builds the portable binary first).
#
# These rules describe the package, whose prefix is /usr: configs go to /etc/xsilo and units to
# /lib/systemd/system whatever the prefix, and the units start /usr/bin/xsilo. From a source
# build, copy the binary instead (docs/operations.md).

# A fuzz build remembers its public-key results (crypto/fuzz_memo.h): never a package's binary.
if(XSILO_FUZZ)
  return()
endif()

install(TARGETS xsilo RUNTIME DESTINATION bin)
install(FILES packaging/etc/server.json packaging/etc/edge.json packaging/etc/agent.json
        DESTINATION /etc/xsilo)
install(FILES packaging/systemd/xsilo-server.service packaging/systemd/xsilo-edge.service
              packaging/systemd/xsilo-agent@.service
        DESTINATION /lib/systemd/system)
install(FILES README.md packaging/debian/copyright DESTINATION share/doc/xsilo)
# Debian's changelog, compressed as Debian wants it (-n: no time stamp, so builds repeat), made
# again when it changes. Its top entry should be this version: a release adds one.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS packaging/debian/changelog)
file(STRINGS packaging/debian/changelog xsilo_changelog_top LIMIT_COUNT 1)
if(NOT xsilo_changelog_top MATCHES "^xsilo \\(${PROJECT_VERSION}\\)")
  message(WARNING "packaging/debian/changelog: the top entry is not version ${PROJECT_VERSION}: add one")
endif()
execute_process(COMMAND gzip -9n -c ${PROJECT_SOURCE_DIR}/packaging/debian/changelog
                OUTPUT_FILE ${PROJECT_BINARY_DIR}/changelog.gz COMMAND_ERROR_IS_FATAL ANY)
install(FILES ${PROJECT_BINARY_DIR}/changelog.gz DESTINATION share/doc/xsilo)
# The docs keep their folder, so README's links work.
file(GLOB xsilo_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES ${xsilo_docs} DESTINATION share/doc/xsilo/docs)

set(CPACK_PACKAGE_NAME xsilo)
set(CPACK_PACKAGE_VENDOR xsilo)
set(XSILO_PACKAGE_MAINTAINER "xsilo maintainers <maintainers@example.org>"
    CACHE STRING "the Debian package's Maintainer field: who builds and answers for this package")
set(CPACK_PACKAGE_CONTACT ${XSILO_PACKAGE_MAINTAINER})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "cross-silo federated learning: server, edge aggregator and silo agent")
set(CPACK_PACKAGE_DESCRIPTION
    "One binary, xsilo, with the federation's server, regional edge aggregators
and the silo agents that hospitals run, over mutual TLS 1.3 with secure
aggregation, robust rules and a signed audit log. Systemd units: xsilo-server,
xsilo-edge, xsilo-agent@SILO.")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The shared libraries' packages come from dpkg-shlibdeps (libssl3, libsodium23, libprotobuf32,
# libspdlog1.10, ...); adduser makes the daemons' user in postinst.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/packaging/debian/conffiles
    ${PROJECT_SOURCE_DIR}/packaging/debian/postinst
    ${PROJECT_SOURCE_DIR}/packaging/debian/prerm
    ${PROJECT_SOURCE_DIR}/packaging/debian/postrm)
# Maintainer scripts 0755, conffiles 0644, whatever the checkout's modes.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
