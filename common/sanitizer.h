// Whether this build runs under AddressSanitizer, for the few tests whose
// bounds it changes (its quarantine keeps freed memory resident; it runs
// code several times slower). gcc's -fsanitize=address defines
// __SANITIZE_ADDRESS__; clang answers __has_feature(address_sanitizer).
#ifndef MUONPS_COMMON_SANITIZER_H_
#define MUONPS_COMMON_SANITIZER_H_

namespace muonps {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

}  // namespace muonps

#endif  // MUONPS_COMMON_SANITIZER_H_
