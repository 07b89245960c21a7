// Element types of the GDN kernels and their scalar conversions (round to nearest even).
//
// Everything here has internal linkage (anonymous namespace) on purpose: each ISA translation
// unit is compiled with its own -m flags, and a shared inline symbol could otherwise be emitted
// with AVX-512 instructions in one unit and picked by the linker for the portable one.
#pragma once

#include <cstdint>
#include <cstring>

namespace gdn {

// Element type of a tensor as seen by the kernels (bf16 and fp16 are raw 16-bit patterns).
enum class DType : int { F32 = 0, BF16 = 1, F16 = 2 };

namespace {

inline const char* dtype_name(DType d) {
    return d == DType::F32 ? "float32" : d == DType::BF16 ? "bfloat16" : "float16";
}

inline int dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_f32(uint16_t b) { return bits_f32(uint32_t(b) << 16); }

// fp32 -> bf16, round to nearest even; NaN stays a quiet NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
        float f = float(mant) * 5.9604644775390625e-8f;
        return bits_f32(f32_bits(f) | sign);
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// fp32 -> fp16, round to nearest even; overflow gives inf, NaN a quiet NaN.
inline uint16_t f32_to_f16(float value) {
    uint32_t f = f32_bits(value);
    const uint32_t sign = f & 0x80000000u;
    f ^= sign;
    uint32_t out;
    if (f >= (143u << 23)) {                   // |x| >= 65536 (or inf / NaN)
        out = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (f < (113u << 23)) {             // |x| < 2^-14: fp16 subnormal or zero
        const uint32_t magic = 126u << 23;      // 0.5f: adding it rounds at the 2^-24 grid (RNE)
        out = f32_bits(bits_f32(f) + bits_f32(magic)) - magic;
    } else {                                   // normal: rebias and round the 13 dropped bits
        uint32_t odd = (f >> 13) & 1u;
        f += (uint32_t(15 - 127) << 23) + 0xfffu + odd;
        out = f >> 13;                          // a carry into the exponent rounds up to inf
    }
    return uint16_t(out | (sign >> 16));
}

// Read element i of a buffer of type dt as fp32.
inline float load_scalar(const void* p, DType dt, int64_t i) {
    switch (dt) {
        case DType::F32: return static_cast<const float*>(p)[i];
        case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
        default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    }
}

// Write fp32 x (rounded to nearest even) as element i of a buffer of type dt.
inline void store_scalar(void* p, DType dt, int64_t i, float x) {
    switch (dt) {
        case DType::F32: static_cast<float*>(p)[i] = x; break;
        case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(x); break;
        default: static_cast<uint16_t*>(p)[i] = f32_to_f16(x); break;
    }
}

}  // namespace
}  // namespace gdn
