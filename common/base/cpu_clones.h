// TESSERA_CPU_CLONES: compiles a hot loop once for AVX2 and once for the baseline x86-64, the loader picking the
// one the CPU runs (GCC's target_clones, resolved once at start-up). The data plane's loops (finite checks, update
// rules) then use 256-bit registers on the machines that have them while the binaries still run on any x86-64.
// AVX2 alone, without FMA: a multiply and an add are never contracted, so both versions compute the same floats.
// Elsewhere (clang, the sanitizer builds; other architectures) it expands to nothing.
#ifndef TESSERA_COMMON_BASE_CPU_CLONES_H_
#define TESSERA_COMMON_BASE_CPU_CLONES_H_

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TESSERA_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TESSERA_CPU_CLONES
#endif

#endif  // TESSERA_COMMON_BASE_CPU_CLONES_H_
