#pragma once
// Whether the tests run under AddressSanitizer. g++ defines __SANITIZE_ADDRESS__; clang answers
// __has_feature(address_sanitizer). TROUPE_TEST_ASAN is 1 under it and 0 otherwise, for #if;
// troupe::test::under_asan says the same to code.

#if defined(__SANITIZE_ADDRESS__)
#define TROUPE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TROUPE_TEST_ASAN 1
#endif
#endif
#ifndef TROUPE_TEST_ASAN
#define TROUPE_TEST_ASAN 0
#endif

namespace troupe::test {
inline constexpr bool under_asan = TROUPE_TEST_ASAN == 1;
}  // namespace troupe::test
