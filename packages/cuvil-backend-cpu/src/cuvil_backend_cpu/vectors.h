/* The vector prelude of the hand-written kernels (attention.c, paged_attention.c, quant_linear.c),
 * pasted in place of their `#include "cuvil_vectors.h"` line by cuvil_backend_cpu.c_prelude, so a
 * built source is one self-contained text (what the kernel cache hashes and signs).
 *
 * VW float lanes of a GCC vector type `vf` (the compiler picks the instructions for the -march it is
 * given); FMA(a, b, c) = a * b + c as one instruction where the ISA has it, because kernels build
 * with -std=c11, where GCC does not contract a*b+c.
 */
#if defined(CUVIL_VW)
/* a forced width in plain vector arithmetic: tests run the AVX-512 (16) and SSE/NEON (4) widths on
   any host, so a host without AVX-512 still checks that path's logic */
#define VW CUVIL_VW
#elif defined(__AVX512F__)
#include <immintrin.h>
#define VW 16
#define FMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif defined(__AVX2__)
#include <immintrin.h>
#define VW 8
#if defined(__FMA__)
#define FMA(a, b, c) ((vf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#endif
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#define VW 4
#define FMA(a, b, c) ((vf)vfmaq_f32((float32x4_t)(c), (float32x4_t)(a), (float32x4_t)(b)))
#else
#define VW 4
#endif
#ifndef FMA
#define FMA(a, b, c) ((a) * (b) + (c))
#endif

typedef float vf __attribute__((vector_size(VW * 4)));
