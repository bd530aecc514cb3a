/* DEPOT_API marks what libdepot_client.so exports: the public classes and
 * functions of the headers in depot/. The library is built with
 * -fvisibility=hidden, so everything without the mark stays inside it
 * (docs/packaging.md).
 *
 * On ELF the same attribute serves the library and its users, so a program
 * that includes these headers needs no definition or flag of its own. Plain C
 * (depot.h) includes this file too.
 */
#ifndef DEPOT_EXPORT_H_
#define DEPOT_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define DEPOT_API __attribute__((visibility("default")))
#else
#define DEPOT_API
#endif

#endif /* DEPOT_EXPORT_H_ */
