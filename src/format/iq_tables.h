// Codebooks of the i-quant types (IQ1_S/M, IQ2_XXS/XS/S, IQ3_XXS/S, IQ4_NL/XS, MXFP4): the lattice
// points a block index selects, already mapped to their integer values. Format constants of GGML.
#pragma once
#include <array>
#include <cstdint>

namespace hyspec::iq {

// Each grid row is one codebook point; a block stores the row index and multiplies by its scale.
extern const std::array<std::array<uint8_t, 8>, 256> kIq2xxsGrid;   // values in {8, 25, 43}
extern const std::array<std::array<uint8_t, 8>, 512> kIq2xsGrid;    // values in {8, 25, 43}
extern const std::array<std::array<uint8_t, 8>, 1024> kIq2sGrid;    // values in {8, 25, 43}
extern const std::array<std::array<uint8_t, 4>, 256> kIq3xxsGrid;   // values in {4, 12, ..., 52, 62}
extern const std::array<std::array<uint8_t, 4>, 512> kIq3sGrid;     // values in {1, 3, ..., 15}
extern const std::array<std::array<int8_t, 8>, 2048> kIq1sGrid;     // values in {-1, 0, 1}

// 7 stored sign bits -> 8 sign bits with even parity (bit 7 completes the parity).
extern const std::array<uint8_t, 128> kEvenParitySigns;

// Non-linear 4-bit codebook of IQ4_NL / IQ4_XS.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// FP4 (e2m1) values doubled, so the e8m0 scale is applied as a half.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

}  // namespace hyspec::iq
