/* minillm::paged_decode, the CPU paged decode kernel (paged_decode.c) as a torch operator.
 *
 * Why an operator as well as the ctypes call: a compiled decode graph (inductor with its C++
 * wrapper) can call an operator through torch's dispatcher without coming back to Python,
 * while a ctypes call cannot be traced at all and a Python operator costs a trip through the
 * interpreter per layer. Built with torch's header-only stable ABI (no libtorch C++ headers,
 * a few seconds of compiling), linked with paged_decode.c into one library, loaded with
 * torch.ops.load_library; its shape function (for tracing) is registered from Python.
 */
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>

extern "C" int paged_decode_f32(const float *q, int64_t q_row, int64_t q_head, const float *k_pool,
                                const float *v_pool, int64_t num_blocks, const int64_t *block_tables,
                                int64_t width, const int64_t *context_lens, float *out, int64_t n,
                                int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size,
                                float scale, int num_threads);

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

/* q [n, heads, D] (rows and heads may be strided, D contiguous), k_pool / v_pool contiguous
 * [blocks, block_size, kv_heads, D] float32, block_tables int64 [n, W], context_lens int64 [n]
 * -> [n, heads, D]. The same contract as minillm.cpu_kernel.paged_decode. */
Tensor paged_decode(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, Tensor context_lens,
                    double scale)
{
    STD_TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 4 && v_pool.dim() == 4,
                    "minillm::paged_decode: q must be [n, heads, D] and the pools [blocks, block_size, kv_heads, D]");
    STD_TORCH_CHECK(q.scalar_type() == ScalarType::Float && k_pool.scalar_type() == ScalarType::Float &&
                        v_pool.scalar_type() == ScalarType::Float,
                    "minillm::paged_decode takes float32 queries and pool");
    STD_TORCH_CHECK(block_tables.scalar_type() == ScalarType::Long && context_lens.scalar_type() == ScalarType::Long,
                    "minillm::paged_decode: block_tables and context_lens must be int64");
    const int64_t n = q.size(0), heads = q.size(1), dim = q.size(2);
    const int64_t blocks = k_pool.size(0), block_size = k_pool.size(1), kv_heads = k_pool.size(2);
    STD_TORCH_CHECK(k_pool.size(3) == dim && v_pool.size(0) == blocks && v_pool.size(1) == block_size &&
                        v_pool.size(2) == kv_heads && v_pool.size(3) == dim && kv_heads > 0 && heads % kv_heads == 0,
                    "minillm::paged_decode: the pools' shapes do not match each other or q");
    STD_TORCH_CHECK(heads > 0 && dim > 0 && blocks > 0 && block_size > 0,
                    "minillm::paged_decode: heads, D, blocks and block_size must each be at least 1");
    STD_TORCH_CHECK(q.is_cpu() && k_pool.is_cpu() && v_pool.is_cpu() && block_tables.is_cpu() && context_lens.is_cpu(),
                    "minillm::paged_decode: every tensor must be on the CPU");
    STD_TORCH_CHECK(q.stride(2) == 1 && k_pool.is_contiguous() && v_pool.is_contiguous(),
                    "minillm::paged_decode reads a contiguous KV pool and queries whose head size is contiguous");
    STD_TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == n && block_tables.is_contiguous() &&
                        context_lens.dim() == 1 && context_lens.size(0) == n && context_lens.is_contiguous(),
                    "minillm::paged_decode: block_tables must be contiguous [n, W] and context_lens [n]");
    Tensor out = torch::stable::new_empty(q, {n, heads, dim});
    const int status = paged_decode_f32(
        static_cast<const float *>(q.data_ptr()), q.stride(0), q.stride(1),
        static_cast<const float *>(k_pool.data_ptr()), static_cast<const float *>(v_pool.data_ptr()), blocks,
        static_cast<const int64_t *>(block_tables.data_ptr()), block_tables.size(1),
        static_cast<const int64_t *>(context_lens.data_ptr()), static_cast<float *>(out.data_ptr()), n, heads,
        kv_heads, dim, block_size, static_cast<float>(scale), static_cast<int>(torch::stable::get_num_threads()));
    STD_TORCH_CHECK(status != -1, "minillm::paged_decode: block_tables holds a block id outside the KV pool, "
                                  "or fewer blocks than a context needs");
    STD_TORCH_CHECK(status != -3, "minillm::paged_decode: the kernel refused its sizes or strides");
    STD_TORCH_CHECK(status == 0, "minillm::paged_decode could not allocate its scores");
    return out;
}

STABLE_TORCH_LIBRARY(minillm, m)
{
    m.def("paged_decode(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, Tensor context_lens, "
          "float scale) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(minillm, CPU, m)
{
    m.impl("paged_decode", TORCH_BOX(&paged_decode));
}
