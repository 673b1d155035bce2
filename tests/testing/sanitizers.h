// TESSERA_HAS_ADDRESS_SANITIZER: 1 in a build with AddressSanitizer (CI's sanitizer check), for tests that must
// skip there. GCC says __SANITIZE_ADDRESS__; clang answers __has_feature(address_sanitizer).
#ifndef TESSERA_TESTS_TESTING_SANITIZERS_H_
#define TESSERA_TESTS_TESTING_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__)
#define TESSERA_HAS_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSERA_HAS_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef TESSERA_HAS_ADDRESS_SANITIZER
#define TESSERA_HAS_ADDRESS_SANITIZER 0
#endif

#endif  // TESSERA_TESTS_TESTING_SANITIZERS_H_
