/* minillm_gemv::linear and ::linear_int8, the decode projections of gemv.c as torch operators.
 *
 * Why operators as well as the ctypes calls: a compiled decode graph (inductor with its C++
 * wrapper) calls an operator through torch's dispatcher without coming back to Python, while
 * a ctypes call cannot be traced. Built with torch's header-only stable ABI, linked with
 * gemv.c into one library, loaded with torch.ops.load_library; the shape functions (for
 * tracing) are registered from Python (minillm/fast/gemv.py). Threads: minillm_gemv_set_op_threads'
 * count where one is set (a CPU decode graph sets it), else torch's intra-op count.
 */
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>

extern "C" int minillm_gemv_f32(const float *x, int64_t m, int64_t ldx, const float *w, int64_t n, int64_t k,
                                int64_t ldw, const float *bias, float *y, int64_t ldy, int threads);
extern "C" int minillm_gemv_i8(const float *x, int64_t m, int64_t ldx, const int8_t *q, const float *scale,
                               int64_t n, int64_t k, int64_t ldw, const float *bias, float *y, int64_t ldy,
                               int threads);

extern "C" int minillm_gemv_op_threads(void);

using torch::headeronly::ScalarType;

static int op_threads()
{
    const int set = minillm_gemv_op_threads();
    return set > 0 ? set : static_cast<int>(torch::stable::get_num_threads());
}
using torch::stable::Tensor;

static void check_common(const Tensor &x, const Tensor &w, const Tensor &bias, const char *name)
{
    STD_TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && x.size(0) > 0 && w.size(0) > 0 &&
                        w.size(1) > 0,
                    name, ": x must be [m, in] and the weight [out, in], every size at least 1");
    STD_TORCH_CHECK(x.scalar_type() == ScalarType::Float, name, ": x must be float32");
    STD_TORCH_CHECK(x.is_cpu() && w.is_cpu() && bias.is_cpu(), name, ": every tensor must be on the CPU");
    STD_TORCH_CHECK(x.is_contiguous() && w.stride(1) == 1 && (w.size(0) == 1 || w.stride(0) >= w.size(1)), name,
                    ": x must be contiguous and the weight's rows contiguous");
    STD_TORCH_CHECK(bias.numel() == 0 || (bias.dim() == 1 && bias.size(0) == w.size(0) && bias.is_contiguous() &&
                                          bias.scalar_type() == ScalarType::Float),
                    name, ": bias must be empty (none) or a contiguous float32 [out]");
}

/* x [m, in] float32, weight [out, in] float32, bias [out] or empty -> [m, out] */
Tensor linear(Tensor x, Tensor weight, Tensor bias)
{
    check_common(x, weight, bias, "minillm_gemv::linear");
    STD_TORCH_CHECK(weight.scalar_type() == ScalarType::Float, "minillm_gemv::linear: the weight must be float32");
    const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
    Tensor out = torch::stable::new_empty(x, {m, n});
    const int status = minillm_gemv_f32(
        static_cast<const float *>(x.data_ptr()), m, k, static_cast<const float *>(weight.data_ptr()), n, k,
        n == 1 ? k : weight.stride(0), bias.numel() ? static_cast<const float *>(bias.data_ptr()) : nullptr,
        static_cast<float *>(out.data_ptr()), n, op_threads());
    STD_TORCH_CHECK(status == 0, "minillm_gemv::linear: the kernel refused its sizes");
    return out;
}

/* x [m, in] float32, q [out, in] int8, scale [out] float32, bias [out] or empty -> [m, out] */
Tensor linear_int8(Tensor x, Tensor q, Tensor scale, Tensor bias)
{
    check_common(x, q, bias, "minillm_gemv::linear_int8");
    STD_TORCH_CHECK(q.scalar_type() == ScalarType::Char, "minillm_gemv::linear_int8: q must be int8");
    STD_TORCH_CHECK(scale.dim() == 1 && scale.size(0) == q.size(0) && scale.is_contiguous() && scale.is_cpu() &&
                        scale.scalar_type() == ScalarType::Float,
                    "minillm_gemv::linear_int8: scale must be a contiguous float32 [out]");
    const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
    Tensor out = torch::stable::new_empty(x, {m, n});
    const int status = minillm_gemv_i8(
        static_cast<const float *>(x.data_ptr()), m, k, static_cast<const int8_t *>(q.data_ptr()),
        static_cast<const float *>(scale.data_ptr()), n, k, n == 1 ? k : q.stride(0),
        bias.numel() ? static_cast<const float *>(bias.data_ptr()) : nullptr, static_cast<float *>(out.data_ptr()),
        n, op_threads());
    STD_TORCH_CHECK(status == 0, "minillm_gemv::linear_int8: the kernel refused its sizes");
    return out;
}

STABLE_TORCH_LIBRARY(minillm_gemv, m)
{
    m.def("linear(Tensor x, Tensor weight, Tensor bias) -> Tensor");
    m.def("linear_int8(Tensor x, Tensor q, Tensor scale, Tensor bias) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(minillm_gemv, CPU, m)
{
    m.impl("linear", TORCH_BOX(&linear));
    m.impl("linear_int8", TORCH_BOX(&linear_int8));
}
