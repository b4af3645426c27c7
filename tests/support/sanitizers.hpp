// SAFECKPT_TEST_ASAN: defined when the test binary is built with
// AddressSanitizer (GCC's __SANITIZE_ADDRESS__, Clang's
// __has_feature(address_sanitizer)). Tests that set RLIMIT_AS skip under it:
// ASan reserves terabytes of address space.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define SAFECKPT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SAFECKPT_TEST_ASAN 1
#endif
#endif
