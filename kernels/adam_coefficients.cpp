// The per-step fp32 terms of the Adam formula, computed the way torch.optim.Adam/AdamW compute
// them: Python floats (doubles) that PyTorch's kernels then cast to float.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "kernels/adam_math.h"
#include "kernels/stochastic_round.h"

namespace tide::kernels {
namespace {

void require(bool ok, const char* name, double value, const char* accepts) {
  if (ok) return;
  std::ostringstream message;
  message << "tide: Adam " << name << " must be " << accepts << ", got " << value;
  throw std::invalid_argument(message.str());
}

}  // namespace

AdamCoefficients adam_coefficients(const AdamHyper& h) {
  require(std::isfinite(h.lr) && h.lr >= 0, "lr", h.lr, "finite and >= 0");
  require(h.beta1 >= 0 && h.beta1 < 1, "beta1", h.beta1, "in [0, 1)");
  require(h.beta2 >= 0 && h.beta2 < 1, "beta2", h.beta2, "in [0, 1)");
  require(std::isfinite(h.eps) && h.eps >= 0, "eps", h.eps, "finite and >= 0");
  require(std::isfinite(h.weight_decay) && h.weight_decay >= 0, "weight_decay", h.weight_decay,
          "finite and >= 0");
  require(h.step >= 1, "step", static_cast<double>(h.step), ">= 1 (steps count from 1)");
  require(std::isfinite(h.grad_scale) && h.grad_scale > 0, "grad_scale", h.grad_scale,
          "finite and > 0");

  const auto step = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
  const double step_size = h.lr / bias_correction1;

  AdamCoefficients c{};
  const auto inv_scale = static_cast<float>(1.0 / h.grad_scale);
  c.grad_mul = h.maximize ? -inv_scale : inv_scale;
  const bool decay = h.weight_decay != 0;
  c.decay = decay && h.decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  c.l2 = decay && !h.decoupled ? static_cast<float>(h.weight_decay) : 0.0f;
  // lerp's weight is a float in PyTorch's kernel, and so is its test against 0.5.
  const auto w = static_cast<float>(1.0 - h.beta1);
  c.lerp_from_grad = !(std::abs(w) < 0.5f);
  c.lerp_w = c.lerp_from_grad ? w - 1.0f : w;
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  // PyTorch divides √v by √bc2; a multiply by the reciprocal spares the CPU's divider a third
  // of its work (kernels/adam_math.h).
  c.inv_bc2_sqrt = static_cast<float>(1.0 / std::pow(bias_correction2, 0.5));
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-step_size);
  // The bound exact Adam keeps, |m| ≤ C·√v (kernels/adam_math.h), for 8-bit moments.
  // No bound (β1² ≥ β2): the largest float, not inf, whose product with √v = 0 would be NaN.
  const double ratio = h.beta1 * h.beta1 / h.beta2;  // β2 = 0: inf
  const double bound =
      ratio < 1 ? (1 - h.beta1) / std::sqrt((1 - h.beta2) * (1 - ratio)) * (1 + 1.0 / 1024)
                : std::numeric_limits<float>::max();
  c.m_bound = static_cast<float>(std::min<double>(bound, std::numeric_limits<float>::max()));
  c.neg_m_bound = -c.m_bound;
  c.rounding_key = rounding_step_key(h.rounding_seed, h.step);
  return c;
}

}  // namespace tide::kernels
