#pragma once
// loss_curve: the training record of an example, written as CSV (one row per step) and as an SVG
// plot that any browser opens. It shows the training loss per step, and the held-out loss and
// held-out accuracy at each evaluation. Header-only, standard library only.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "troupe/tensors/error.hpp"

namespace example {

/// Per-step training losses and periodic held-out evaluations.
class loss_curve {
 public:
  void add_step(int step, double train_loss) { steps_.push_back({step, train_loss}); }
  void add_eval(int step, double loss, double accuracy) { evals_.push_back({step, loss, accuracy}); }

  /// Writes "step,train_loss,heldout_loss,heldout_accuracy", one row per step or evaluation, in
  /// step order; a column without a value is empty. Throws troupe::error (io_error) when the
  /// file cannot be written.
  void write_csv(const std::string& path) const {
    std::ofstream out(path);
    out << "step,train_loss,heldout_loss,heldout_accuracy\n";
    std::size_t s = 0, e = 0;
    while (s < steps_.size() || e < evals_.size()) {
      const int step =
          std::min(s < steps_.size() ? steps_[s].step : INT_MAX, e < evals_.size() ? evals_[e].step : INT_MAX);
      out << step << ',';
      if (s < steps_.size() && steps_[s].step == step) out << steps_[s++].loss;
      out << ',';
      if (e < evals_.size() && evals_[e].step == step) {
        out << evals_[e].loss << ',' << evals_[e].accuracy;
        ++e;
      } else {
        out << ',';
      }
      out << '\n';
    }
    if (!out) throw troupe::error(troupe::errc::io_error, "cannot write " + path);
  }

  /// Writes the plot: losses on the left axis (0 to the largest loss), accuracy on the right
  /// (0 to 100%). Throws troupe::error (io_error) when the file cannot be written.
  void write_svg(const std::string& path, const std::string& title) const {
    std::ofstream out(path);
    out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        << "<text x=\"" << width / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">" << title << "</text>\n";
    write_axes(out);
    out << polyline(train_points(), "#9ab7d8", 1) << polyline(eval_points(false), "#1f4e8c", 2.5)
        << polyline(eval_points(true), "#c0392b", 2.5);
    write_legend(out);
    out << "</svg>\n";
    if (!out) throw troupe::error(troupe::errc::io_error, "cannot write " + path);
  }

 private:
  struct step_row {
    int step;
    double loss;
  };
  struct eval_row {
    int step;
    double loss;
    double accuracy;
  };
  static constexpr int width = 720, height = 400, left = 60, right = 60, top = 35, bottom = 45;

  double max_step() const { return steps_.empty() ? 1.0 : std::max(1, steps_.back().step); }
  double max_loss() const {
    double m = 1e-9;
    for (const auto& s : steps_) m = std::max(m, std::isfinite(s.loss) ? s.loss : 0.0);
    for (const auto& e : evals_) m = std::max(m, std::isfinite(e.loss) ? e.loss : 0.0);
    return m;
  }
  static double x_of(double step, double max_step) { return left + (width - left - right) * step / max_step; }
  static double y_of(double fraction) { return top + (height - top - bottom) * (1.0 - std::clamp(fraction, 0.0, 1.0)); }

  std::vector<std::pair<double, double>> train_points() const {
    std::vector<std::pair<double, double>> p;
    for (const auto& s : steps_) p.emplace_back(x_of(s.step, max_step()), y_of(s.loss / max_loss()));
    return p;
  }
  std::vector<std::pair<double, double>> eval_points(bool accuracy) const {
    std::vector<std::pair<double, double>> p;
    for (const auto& e : evals_)
      p.emplace_back(x_of(e.step, max_step()), y_of(accuracy ? e.accuracy : e.loss / max_loss()));
    return p;
  }
  static std::string polyline(const std::vector<std::pair<double, double>>& points, const char* colour, double w) {
    std::string s = "<polyline fill=\"none\" stroke=\"" + std::string(colour) + "\" stroke-width=\"" +
                    std::to_string(w) + "\" points=\"";
    char buf[48];
    for (const auto& [x, y] : points) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x, y);
      s += buf;
    }
    return s + "\"/>\n";
  }

  void write_axes(std::ofstream& out) const {
    char buf[320];
    for (int i = 0; i <= 4; ++i) {  // grid, loss ticks (left), accuracy ticks (right)
      const double y = y_of(i / 4.0);
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                    "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n"
                    "<text x=\"%d\" y=\"%.1f\">%d%%</text>\n",
                    left, y, width - right, y, left - 6, y + 4, max_loss() * i / 4.0, width - right + 6, y + 4, 25 * i);
      out << buf;
    }
    for (int i = 0; i <= 4; ++i) {  // step ticks
      std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n",
                    x_of(max_step() * i / 4.0, max_step()), height - bottom + 18, static_cast<int>(max_step() * i / 4));
      out << buf;
    }
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
                  left, top, width - left - right, height - top - bottom, width / 2, height - 8);
    out << buf;
  }

  static void write_legend(std::ofstream& out) {
    const char* names[] = {"training loss (rank 0's batch)", "held-out loss", "held-out accuracy (right axis)"};
    const char* colours[] = {"#9ab7d8", "#1f4e8c", "#c0392b"};
    char buf[256];
    for (int i = 0; i < 3; ++i) {
      // Mid-right: clear of both curves once the model has learned.
      const int y = top + (height - top - bottom) / 2 - 10 + 16 * i;
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>"
                    "<text x=\"%d\" y=\"%d\">%s</text>\n",
                    width - right - 250, y - 4, width - right - 228, y - 4, colours[i], width - right - 222, y,
                    names[i]);
      out << buf;
    }
  }

  std::vector<step_row> steps_;
  std::vector<eval_row> evals_;
};

}  // namespace example
