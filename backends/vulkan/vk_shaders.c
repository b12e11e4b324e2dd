/*
 * backends/vulkan/vk_shaders.c — the embedded SPIR-V. Each <name>.spv.inc is written at build
 * time by `glslc -mfmt=c` from shaders/shaders.list (CMake and Meson read the same list);
 * keep this table in the same order as that list.
 */
#include "backends/vulkan/vk_impl.h"

static const uint32_t spv_matmul_f32[] =
#include "matmul_f32.spv.inc"
    ;
static const uint32_t spv_matmul_f16[] =
#include "matmul_f16.spv.inc"
    ;
static const uint32_t spv_matmul_bf16[] =
#include "matmul_bf16.spv.inc"
    ;
static const uint32_t spv_matmul_q8_0[] =
#include "matmul_q8_0.spv.inc"
    ;
static const uint32_t spv_matmul_q4_k[] =
#include "matmul_q4_k.spv.inc"
    ;
static const uint32_t spv_matmul_q2_k[] =
#include "matmul_q2_k.spv.inc"
    ;
static const uint32_t spv_matmul_mxfp4[] =
#include "matmul_mxfp4.spv.inc"
    ;
static const uint32_t spv_matmul_fp8_b128[] =
#include "matmul_fp8_b128.spv.inc"
    ;
static const uint32_t spv_matmul_fp8_b32[] =
#include "matmul_fp8_b32.spv.inc"
    ;
static const uint32_t spv_rms_norm[] =
#include "rms_norm.spv.inc"
    ;
static const uint32_t spv_eltwise[] =
#include "eltwise.spv.inc"
    ;
static const uint32_t spv_rope[] =
#include "rope.spv.inc"
    ;
static const uint32_t spv_fake_quant[] =
#include "fake_quant.spv.inc"
    ;
static const uint32_t spv_hadamard[] =
#include "hadamard.spv.inc"
    ;
static const uint32_t spv_hc_mix[] =
#include "hc_mix.spv.inc"
    ;
static const uint32_t spv_compress_pool[] =
#include "compress_pool.spv.inc"
    ;
static const uint32_t spv_indexer[] =
#include "indexer.spv.inc"
    ;
static const uint32_t spv_attn_sink[] =
#include "attn_sink.spv.inc"
    ;
static const uint32_t spv_moe_route[] =
#include "moe_route.spv.inc"
    ;
static const uint32_t spv_engram_gate[] =
#include "engram_gate.spv.inc"
    ;
static const uint32_t spv_rows[] =
#include "rows.spv.inc"
    ;
static const uint32_t spv_matmul_f32_sg[] =
#include "matmul_f32_sg.spv.inc"
    ;
static const uint32_t spv_matmul_f16_sg[] =
#include "matmul_f16_sg.spv.inc"
    ;
static const uint32_t spv_matmul_bf16_sg[] =
#include "matmul_bf16_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q8_0_sg[] =
#include "matmul_q8_0_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q4_k_sg[] =
#include "matmul_q4_k_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q2_k_sg[] =
#include "matmul_q2_k_sg.spv.inc"
    ;
static const uint32_t spv_matmul_mxfp4_sg[] =
#include "matmul_mxfp4_sg.spv.inc"
    ;
static const uint32_t spv_matmul_fp8_b128_sg[] =
#include "matmul_fp8_b128_sg.spv.inc"
    ;
static const uint32_t spv_matmul_fp8_b32_sg[] =
#include "matmul_fp8_b32_sg.spv.inc"
    ;

/* ggml weight types of shaders/wload_ggml.glsl (appended to shaders.list) */
static const uint32_t spv_matmul_q4_0[] =
#include "matmul_q4_0.spv.inc"
    ;
static const uint32_t spv_matmul_q4_1[] =
#include "matmul_q4_1.spv.inc"
    ;
static const uint32_t spv_matmul_q5_0[] =
#include "matmul_q5_0.spv.inc"
    ;
static const uint32_t spv_matmul_q5_1[] =
#include "matmul_q5_1.spv.inc"
    ;
static const uint32_t spv_matmul_q3_k[] =
#include "matmul_q3_k.spv.inc"
    ;
static const uint32_t spv_matmul_q5_k[] =
#include "matmul_q5_k.spv.inc"
    ;
static const uint32_t spv_matmul_q6_k[] =
#include "matmul_q6_k.spv.inc"
    ;
static const uint32_t spv_matmul_iq4_nl[] =
#include "matmul_iq4_nl.spv.inc"
    ;
static const uint32_t spv_matmul_iq4_xs[] =
#include "matmul_iq4_xs.spv.inc"
    ;
static const uint32_t spv_matmul_iq3_xxs[] =
#include "matmul_iq3_xxs.spv.inc"
    ;
static const uint32_t spv_matmul_iq3_s[] =
#include "matmul_iq3_s.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_xxs[] =
#include "matmul_iq2_xxs.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_xs[] =
#include "matmul_iq2_xs.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_s[] =
#include "matmul_iq2_s.spv.inc"
    ;
static const uint32_t spv_matmul_iq1_s[] =
#include "matmul_iq1_s.spv.inc"
    ;
static const uint32_t spv_matmul_iq1_m[] =
#include "matmul_iq1_m.spv.inc"
    ;
static const uint32_t spv_matmul_q4_0_sg[] =
#include "matmul_q4_0_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q4_1_sg[] =
#include "matmul_q4_1_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q5_0_sg[] =
#include "matmul_q5_0_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q5_1_sg[] =
#include "matmul_q5_1_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q3_k_sg[] =
#include "matmul_q3_k_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q5_k_sg[] =
#include "matmul_q5_k_sg.spv.inc"
    ;
static const uint32_t spv_matmul_q6_k_sg[] =
#include "matmul_q6_k_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq4_nl_sg[] =
#include "matmul_iq4_nl_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq4_xs_sg[] =
#include "matmul_iq4_xs_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq3_xxs_sg[] =
#include "matmul_iq3_xxs_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq3_s_sg[] =
#include "matmul_iq3_s_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_xxs_sg[] =
#include "matmul_iq2_xxs_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_xs_sg[] =
#include "matmul_iq2_xs_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_s_sg[] =
#include "matmul_iq2_s_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq1_s_sg[] =
#include "matmul_iq1_s_sg.spv.inc"
    ;
static const uint32_t spv_matmul_iq1_m_sg[] =
#include "matmul_iq1_m_sg.spv.inc"
    ;

/* needs: device features the variant requires (baseline shaders: none beyond Vulkan 1.1
 * compute; "<name>_sg": subgroup arithmetic); n_bindings: storage buffers the shader declares. */
static const uint32_t spv_matmul_f32_nw[] =
#include "matmul_f32_nw.spv.inc"
    ;
static const uint32_t spv_matmul_f16_nw[] =
#include "matmul_f16_nw.spv.inc"
    ;
static const uint32_t spv_matmul_bf16_nw[] =
#include "matmul_bf16_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q8_0_nw[] =
#include "matmul_q8_0_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q4_k_nw[] =
#include "matmul_q4_k_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q2_k_nw[] =
#include "matmul_q2_k_nw.spv.inc"
    ;
static const uint32_t spv_matmul_mxfp4_nw[] =
#include "matmul_mxfp4_nw.spv.inc"
    ;
static const uint32_t spv_matmul_fp8_b128_nw[] =
#include "matmul_fp8_b128_nw.spv.inc"
    ;
static const uint32_t spv_matmul_fp8_b32_nw[] =
#include "matmul_fp8_b32_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q4_0_nw[] =
#include "matmul_q4_0_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q4_1_nw[] =
#include "matmul_q4_1_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q5_0_nw[] =
#include "matmul_q5_0_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q5_1_nw[] =
#include "matmul_q5_1_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q3_k_nw[] =
#include "matmul_q3_k_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q5_k_nw[] =
#include "matmul_q5_k_nw.spv.inc"
    ;
static const uint32_t spv_matmul_q6_k_nw[] =
#include "matmul_q6_k_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq4_nl_nw[] =
#include "matmul_iq4_nl_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq4_xs_nw[] =
#include "matmul_iq4_xs_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq3_xxs_nw[] =
#include "matmul_iq3_xxs_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq3_s_nw[] =
#include "matmul_iq3_s_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_xxs_nw[] =
#include "matmul_iq2_xxs_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_xs_nw[] =
#include "matmul_iq2_xs_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq2_s_nw[] =
#include "matmul_iq2_s_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq1_s_nw[] =
#include "matmul_iq1_s_nw.spv.inc"
    ;
static const uint32_t spv_matmul_iq1_m_nw[] =
#include "matmul_iq1_m_nw.spv.inc"
    ;

static const uint32_t spv_attn_sink_nw[] =
#include "attn_sink_nw.spv.inc"
    ;
static const uint32_t spv_indexer_nw[] =
#include "indexer_nw.spv.inc"
    ;

const dsib_vk_shader dsib_vk_shaders[] = {
    {"matmul_f32", spv_matmul_f32, sizeof spv_matmul_f32, 0, 4},
    {"matmul_f16", spv_matmul_f16, sizeof spv_matmul_f16, 0, 4},
    {"matmul_bf16", spv_matmul_bf16, sizeof spv_matmul_bf16, 0, 4},
    {"matmul_q8_0", spv_matmul_q8_0, sizeof spv_matmul_q8_0, 0, 4},
    {"matmul_q4_k", spv_matmul_q4_k, sizeof spv_matmul_q4_k, 0, 4},
    {"matmul_q2_k", spv_matmul_q2_k, sizeof spv_matmul_q2_k, 0, 4},
    {"matmul_mxfp4", spv_matmul_mxfp4, sizeof spv_matmul_mxfp4, 0, 4},
    {"matmul_fp8_b128", spv_matmul_fp8_b128, sizeof spv_matmul_fp8_b128, 0, 4},
    {"matmul_fp8_b32", spv_matmul_fp8_b32, sizeof spv_matmul_fp8_b32, 0, 4},
    {"rms_norm", spv_rms_norm, sizeof spv_rms_norm, 0, 3},
    {"eltwise", spv_eltwise, sizeof spv_eltwise, 0, 5},
    {"rope", spv_rope, sizeof spv_rope, 0, 3},
    {"fake_quant", spv_fake_quant, sizeof spv_fake_quant, 0, 1},
    {"hadamard", spv_hadamard, sizeof spv_hadamard, 0, 1},
    {"hc_mix", spv_hc_mix, sizeof spv_hc_mix, 0, 4},
    {"compress_pool", spv_compress_pool, sizeof spv_compress_pool, 0, 6},
    {"indexer", spv_indexer, sizeof spv_indexer, 0, 8},
    {"attn_sink", spv_attn_sink, sizeof spv_attn_sink, 0, 8},
    {"moe_route", spv_moe_route, sizeof spv_moe_route, 0, 6},
    {"engram_gate", spv_engram_gate, sizeof spv_engram_gate, 0, 4},
    {"rows", spv_rows, sizeof spv_rows, 0, 3},
    {"matmul_f32_sg", spv_matmul_f32_sg, sizeof spv_matmul_f32_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_f16_sg", spv_matmul_f16_sg, sizeof spv_matmul_f16_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_bf16_sg", spv_matmul_bf16_sg, sizeof spv_matmul_bf16_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q8_0_sg", spv_matmul_q8_0_sg, sizeof spv_matmul_q8_0_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q4_k_sg", spv_matmul_q4_k_sg, sizeof spv_matmul_q4_k_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q2_k_sg", spv_matmul_q2_k_sg, sizeof spv_matmul_q2_k_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_mxfp4_sg", spv_matmul_mxfp4_sg, sizeof spv_matmul_mxfp4_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_fp8_b128_sg", spv_matmul_fp8_b128_sg, sizeof spv_matmul_fp8_b128_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_fp8_b32_sg", spv_matmul_fp8_b32_sg, sizeof spv_matmul_fp8_b32_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q4_0", spv_matmul_q4_0, sizeof spv_matmul_q4_0, 0, 4},
    {"matmul_q4_1", spv_matmul_q4_1, sizeof spv_matmul_q4_1, 0, 4},
    {"matmul_q5_0", spv_matmul_q5_0, sizeof spv_matmul_q5_0, 0, 4},
    {"matmul_q5_1", spv_matmul_q5_1, sizeof spv_matmul_q5_1, 0, 4},
    {"matmul_q3_k", spv_matmul_q3_k, sizeof spv_matmul_q3_k, 0, 4},
    {"matmul_q5_k", spv_matmul_q5_k, sizeof spv_matmul_q5_k, 0, 4},
    {"matmul_q6_k", spv_matmul_q6_k, sizeof spv_matmul_q6_k, 0, 4},
    {"matmul_iq4_nl", spv_matmul_iq4_nl, sizeof spv_matmul_iq4_nl, 0, 4},
    {"matmul_iq4_xs", spv_matmul_iq4_xs, sizeof spv_matmul_iq4_xs, 0, 4},
    {"matmul_iq3_xxs", spv_matmul_iq3_xxs, sizeof spv_matmul_iq3_xxs, 0, 4},
    {"matmul_iq3_s", spv_matmul_iq3_s, sizeof spv_matmul_iq3_s, 0, 4},
    {"matmul_iq2_xxs", spv_matmul_iq2_xxs, sizeof spv_matmul_iq2_xxs, 0, 4},
    {"matmul_iq2_xs", spv_matmul_iq2_xs, sizeof spv_matmul_iq2_xs, 0, 4},
    {"matmul_iq2_s", spv_matmul_iq2_s, sizeof spv_matmul_iq2_s, 0, 4},
    {"matmul_iq1_s", spv_matmul_iq1_s, sizeof spv_matmul_iq1_s, 0, 4},
    {"matmul_iq1_m", spv_matmul_iq1_m, sizeof spv_matmul_iq1_m, 0, 4},
    {"matmul_q4_0_sg", spv_matmul_q4_0_sg, sizeof spv_matmul_q4_0_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q4_1_sg", spv_matmul_q4_1_sg, sizeof spv_matmul_q4_1_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q5_0_sg", spv_matmul_q5_0_sg, sizeof spv_matmul_q5_0_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q5_1_sg", spv_matmul_q5_1_sg, sizeof spv_matmul_q5_1_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q3_k_sg", spv_matmul_q3_k_sg, sizeof spv_matmul_q3_k_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q5_k_sg", spv_matmul_q5_k_sg, sizeof spv_matmul_q5_k_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_q6_k_sg", spv_matmul_q6_k_sg, sizeof spv_matmul_q6_k_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq4_nl_sg", spv_matmul_iq4_nl_sg, sizeof spv_matmul_iq4_nl_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq4_xs_sg", spv_matmul_iq4_xs_sg, sizeof spv_matmul_iq4_xs_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq3_xxs_sg", spv_matmul_iq3_xxs_sg, sizeof spv_matmul_iq3_xxs_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq3_s_sg", spv_matmul_iq3_s_sg, sizeof spv_matmul_iq3_s_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq2_xxs_sg", spv_matmul_iq2_xxs_sg, sizeof spv_matmul_iq2_xxs_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq2_xs_sg", spv_matmul_iq2_xs_sg, sizeof spv_matmul_iq2_xs_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq2_s_sg", spv_matmul_iq2_s_sg, sizeof spv_matmul_iq2_s_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq1_s_sg", spv_matmul_iq1_s_sg, sizeof spv_matmul_iq1_s_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_iq1_m_sg", spv_matmul_iq1_m_sg, sizeof spv_matmul_iq1_m_sg, DSIB_VK_NEED_SUBGROUP_ARITH, 4},
    {"matmul_f32_nw", spv_matmul_f32_nw, sizeof spv_matmul_f32_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_f16_nw", spv_matmul_f16_nw, sizeof spv_matmul_f16_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_bf16_nw", spv_matmul_bf16_nw, sizeof spv_matmul_bf16_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q8_0_nw", spv_matmul_q8_0_nw, sizeof spv_matmul_q8_0_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q4_k_nw", spv_matmul_q4_k_nw, sizeof spv_matmul_q4_k_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q2_k_nw", spv_matmul_q2_k_nw, sizeof spv_matmul_q2_k_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_mxfp4_nw", spv_matmul_mxfp4_nw, sizeof spv_matmul_mxfp4_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_fp8_b128_nw", spv_matmul_fp8_b128_nw, sizeof spv_matmul_fp8_b128_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_fp8_b32_nw", spv_matmul_fp8_b32_nw, sizeof spv_matmul_fp8_b32_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q4_0_nw", spv_matmul_q4_0_nw, sizeof spv_matmul_q4_0_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q4_1_nw", spv_matmul_q4_1_nw, sizeof spv_matmul_q4_1_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q5_0_nw", spv_matmul_q5_0_nw, sizeof spv_matmul_q5_0_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q5_1_nw", spv_matmul_q5_1_nw, sizeof spv_matmul_q5_1_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q3_k_nw", spv_matmul_q3_k_nw, sizeof spv_matmul_q3_k_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q5_k_nw", spv_matmul_q5_k_nw, sizeof spv_matmul_q5_k_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_q6_k_nw", spv_matmul_q6_k_nw, sizeof spv_matmul_q6_k_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq4_nl_nw", spv_matmul_iq4_nl_nw, sizeof spv_matmul_iq4_nl_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq4_xs_nw", spv_matmul_iq4_xs_nw, sizeof spv_matmul_iq4_xs_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq3_xxs_nw", spv_matmul_iq3_xxs_nw, sizeof spv_matmul_iq3_xxs_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq3_s_nw", spv_matmul_iq3_s_nw, sizeof spv_matmul_iq3_s_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq2_xxs_nw", spv_matmul_iq2_xxs_nw, sizeof spv_matmul_iq2_xxs_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq2_xs_nw", spv_matmul_iq2_xs_nw, sizeof spv_matmul_iq2_xs_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq2_s_nw", spv_matmul_iq2_s_nw, sizeof spv_matmul_iq2_s_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq1_s_nw", spv_matmul_iq1_s_nw, sizeof spv_matmul_iq1_s_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"matmul_iq1_m_nw", spv_matmul_iq1_m_nw, sizeof spv_matmul_iq1_m_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 4},
    {"attn_sink_nw", spv_attn_sink_nw, sizeof spv_attn_sink_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 8},
    {"indexer_nw", spv_indexer_nw, sizeof spv_indexer_nw, DSIB_VK_NEED_SUBGROUP_ARITH | DSIB_VK_NEED_NARROW, 8},
};
const size_t dsib_vk_n_shaders = sizeof dsib_vk_shaders / sizeof dsib_vk_shaders[0];
