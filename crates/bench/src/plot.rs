//! Renders the benchmark plots as SVG line charts without external dependencies.
//!
//! Keeping this std-only means the experiments can emit figures on any machine
//! that builds the workspace, with no plotting toolchain or font setup needed.

/// One line on a chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Use a log10 scale on the y axis (values <= 0 are skipped).
    pub log_y: bool,
    pub series: Vec<Series>,
}

const W: f64 = 800.0;
const H: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = W - 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = H - 60.0;
const MIDDLE: &str = "text-anchor='middle'";
const END: &str = "text-anchor='end' dominant-baseline='middle'";
const START: &str = "text-anchor='start' dominant-baseline='middle'";
const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// An axis domain in plotting space (log10 of the value for log axes) with labelled ticks.
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<(f64, String)>,
}

impl Axis {
    /// Maps a plotting-space value onto the pixel range `a..b`.
    fn map(&self, v: f64, a: f64, b: f64) -> f64 {
        a + (v - self.lo) / (self.hi - self.lo) * (b - a)
    }
}

impl Chart {
    /// Renders the chart as a standalone SVG document (width 800, height 500).
    pub fn to_svg(&self) -> String {
        let log = self.log_y;
        // Filter once so axis ranges and drawing agree on which points exist.
        let data: Vec<Vec<(f64, f64)>> = (self.series.iter())
            .map(|s| {
                let ok = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!log || y > 0.0);
                s.points.iter().copied().filter(ok).collect()
            })
            .collect();
        let all = || data.iter().flatten();
        let xa = linear_axis(min_max(all().map(|p| p.0)).unwrap_or((0.0, 1.0)));
        let y_range = min_max(all().map(|p| p.1));
        let ya = match log {
            true => log_axis(y_range.unwrap_or((1.0, 10.0))),
            false => linear_axis(y_range.unwrap_or((0.0, 1.0))),
        };
        let px = |x: f64| xa.map(x, LEFT, RIGHT);
        let py = |y: f64| ya.map(if log { y.log10() } else { y }, BOTTOM, TOP);

        let mut s = format!(
            "<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' \
             viewBox='0 0 {W} {H}' font-family='sans-serif' font-size='12'>\n"
        );
        rect(&mut s, 0.0, 0.0, W, H, "fill='white'");
        text(&mut s, W / 2.0, 28.0, "font-size='18'", &self.title);
        let grid = "stroke='#e0e0e0'";
        for (v, label) in &xa.ticks {
            let x = xa.map(*v, LEFT, RIGHT);
            line(&mut s, x, TOP, x, BOTTOM, grid);
            text(&mut s, x, BOTTOM + 18.0, "", label);
        }
        for (v, label) in &ya.ticks {
            let y = ya.map(*v, BOTTOM, TOP);
            line(&mut s, LEFT, y, RIGHT, y, grid);
            text(&mut s, LEFT - 8.0, y, END, label);
        }
        let frame = "fill='none' stroke='black'";
        rect(&mut s, LEFT, TOP, RIGHT - LEFT, BOTTOM - TOP, frame);
        for (i, pts) in data.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            let coords: Vec<String> = (pts.iter())
                .map(|&(x, y)| format!("{},{}", num(px(x)), num(py(y))))
                .collect();
            if coords.len() > 1 {
                let pts = coords.join(" ");
                s += &format!("<polyline points='{pts}' fill='none' {}/>\n", stroke(c));
            }
            for &(x, y) in pts {
                circle(&mut s, px(x), py(y), c, " class='pt'");
            }
        }
        if !self.series.is_empty() {
            // Width is estimated from character count since there is no font metrics here.
            let longest = (self.series.iter()).map(|s| s.name.chars().count()).max();
            let (lx, ly) = (LEFT + 10.0, TOP + 10.0);
            let w = longest.unwrap_or(0) as f64 * 7.0 + 40.0;
            let h = self.series.len() as f64 * 18.0 + 8.0;
            let bg = "fill='white' fill-opacity='0.8' stroke='#bbbbbb'";
            rect(&mut s, lx, ly, w, h, bg);
            for (i, series) in self.series.iter().enumerate() {
                let c = PALETTE[i % PALETTE.len()];
                let y = ly + 13.0 + i as f64 * 18.0;
                line(&mut s, lx + 6.0, y, lx + 26.0, y, &stroke(c));
                circle(&mut s, lx + 16.0, y, c, "");
                text(&mut s, lx + 32.0, y, START, &series.name);
            }
        }
        let (cx, cy) = ((LEFT + RIGHT) / 2.0, (TOP + BOTTOM) / 2.0);
        text(&mut s, cx, H - 15.0, "font-size='14'", &self.x_label);
        let rot = format!("font-size='14' transform='rotate(-90 20 {})'", num(cy));
        text(&mut s, 20.0, cy, &rot, &self.y_label);
        s.push_str("</svg>\n");
        s
    }
}

fn stroke(colour: &str) -> String {
    format!("stroke='{colour}' stroke-width='2'")
}

fn line(s: &mut String, x1: f64, y1: f64, x2: f64, y2: f64, style: &str) {
    let (x1, y1, x2, y2) = (num(x1), num(y1), num(x2), num(y2));
    *s += &format!("<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' {style}/>\n");
}

fn rect(s: &mut String, x: f64, y: f64, w: f64, h: f64, style: &str) {
    let (x, y, w, h) = (num(x), num(y), num(w), num(h));
    *s += &format!("<rect x='{x}' y='{y}' width='{w}' height='{h}' {style}/>\n");
}

fn circle(s: &mut String, x: f64, y: f64, colour: &str, extra: &str) {
    let (x, y) = (num(x), num(y));
    *s += &format!("<circle{extra} cx='{x}' cy='{y}' r='3' fill='{colour}'/>\n");
}

/// Text is centred unless `attrs` sets its own anchor, since most labels sit under a point.
fn text(s: &mut String, x: f64, y: f64, attrs: &str, body: &str) {
    let (x, y, body) = (num(x), num(y), esc(body));
    let attrs = match attrs.contains("text-anchor") {
        true => attrs.to_string(),
        false => format!("{MIDDLE} {attrs}"),
    };
    *s += &format!("<text x='{x}' y='{y}' {}>{body}</text>\n", attrs.trim_end());
}

fn min_max(it: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    it.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((a, b)) => Some((a.min(v), b.max(v))),
    })
}

/// Picks a 1/2/5 x 10^k step giving 5-8 ticks and widens the domain to whole steps.
fn linear_axis((mut lo, mut hi): (f64, f64)) -> Axis {
    if hi - lo <= f64::EPSILON * lo.abs().max(hi.abs()) {
        // A flat line still needs a visible band around it.
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        lo -= pad;
        hi += pad;
    }
    let span = hi - lo;
    if !(span.is_finite() && span > 0.0) {
        // Only reachable near f64::MAX; a placeholder axis beats overflowing.
        return linear_axis((-1.0, 1.0));
    }
    let k0 = (span / 6.0).log10().floor() as i32;
    let mut best: Option<(f64, f64, f64, f64)> = None; // (score, step, first, last)
    for k in k0 - 2..=k0 + 2 {
        for m in [5.0, 2.0, 1.0] {
            let step = m * 10f64.powi(k);
            let (first, last) = ((lo / step).floor(), (hi / step).ceil());
            if !(first * step).is_finite() || !(last * step).is_finite() {
                continue;
            }
            let n = last - first + 1.0;
            // Anything in 5..=8 is fine; otherwise get as close as possible.
            let score = (n - 6.5).abs().max(1.5) - 1.5;
            if best.is_none_or(|b| score < b.0) {
                best = Some((score, step, first, last));
            }
        }
    }
    let Some((_, step, first, last)) = best else {
        return linear_axis((-1.0, 1.0));
    };
    let ticks = (0..=(last - first) as i64)
        .map(|i| {
            // Multiplying integer indices avoids accumulating rounding error.
            let v = (first + i as f64) * step;
            let v = if v.abs() < step * 1e-9 { 0.0 } else { v };
            (v, label(v, step))
        })
        .collect();
    let (lo, hi) = (first * step, last * step);
    Axis { lo, hi, ticks }
}

/// Log axis over positive `min..=max`; the domain is in log10 units.
fn log_axis((mut min, mut max): (f64, f64)) -> Axis {
    if max / min < 1.0001 {
        min /= 3.0;
        max *= 3.0;
    }
    let (a, b) = (min.log10(), max.log10());
    if b - a < 2.0 {
        // Short ranges get a 1-2-5 ladder so there are enough ticks to read values.
        let ladder: Vec<f64> = (a.floor() as i32 - 1..=b.ceil() as i32 + 1)
            .flat_map(|d| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(d)))
            .filter(|v| *v > 0.0 && v.is_finite())
            .collect();
        let lo = ladder.iter().rev().find(|v| **v <= min * (1.0 + 1e-9));
        let hi = ladder.iter().find(|v| **v >= max * (1.0 - 1e-9));
        if let (Some(&lo), Some(&hi)) = (lo, hi) {
            let ticks = ladder
                .iter()
                .filter(|v| **v >= lo && **v <= hi)
                .map(|&v| (v.log10(), label(v, v)))
                .collect();
            let (lo, hi) = (lo.log10(), hi.log10());
            return Axis { lo, hi, ticks };
        }
    }
    let (lo, hi) = (a.floor() as i32, b.ceil() as i32);
    let step = ((hi - lo + 6) / 7).max(1);
    let hi = lo + step * ((hi - lo + step - 1) / step).max(1);
    let ticks = (lo..=hi)
        .step_by(step as usize)
        .map(|d| (d as f64, 10f64.powi(d)))
        .filter(|(_, v)| v.is_finite() && *v > 0.0)
        .map(|(d, v)| (d, label(v, v)))
        .collect();
    let (lo, hi) = (lo as f64, hi as f64);
    Axis { lo, hi, ticks }
}

/// Compact tick label; `step` is the tick spacing, which decides how many decimals matter.
fn label(v: f64, step: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-4..1e15).contains(&a) {
        let s = format!("{v:.2e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        return format!("{}e{e}", trim(m));
    }
    for (div, suffix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if a >= div {
            let d = decimals(step / div);
            if d <= 3 {
                return format!("{}{suffix}", trim(&format!("{:.*}", d, v / div)));
            }
            break;
        }
    }
    trim(&format!("{:.*}", decimals(step).min(15), v))
}

fn decimals(step: f64) -> usize {
    (-step.log10() - 1e-9).ceil().clamp(0.0, 20.0) as usize
}

/// Strips trailing zeros so labels and coordinates stay short.
fn trim(s: &str) -> String {
    let t = if s.contains('.') {
        s.trim_end_matches('0')
    } else {
        s
    };
    let t = t.trim_end_matches('.');
    (if t == "-0" { "0" } else { t }).into()
}

/// Formats an SVG coordinate with at most two decimals.
fn num(v: f64) -> String {
    trim(&format!("{:.2}", if v.is_finite() { v } else { 0.0 }))
}

/// Text content only; attributes never carry user text, so `'` needs no escaping.
fn esc(s: &str) -> String {
    let s = s.replace('&', "&amp;").replace('<', "&lt;");
    s.replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(title: &str, log_y: bool, series: Vec<(&str, Vec<(f64, f64)>)>) -> String {
        let (x_label, y_label) = (String::from("x"), String::from("y"));
        let series = (series.into_iter())
            .map(|(n, points)| Series {
                name: n.into(),
                points,
            })
            .collect();
        let title = title.to_string();
        let svg = Chart {
            title,
            x_label,
            y_label,
            log_y,
            series,
        }
        .to_svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        svg
    }

    fn markers(svg: &str) -> usize {
        svg.matches("class='pt'").count()
    }

    #[test]
    fn names_and_escaping() {
        let two = vec![("alpha", vec![(1.0, 2.0)]), ("b\"<", vec![])];
        let svg = render("T", false, two);
        assert!(svg.contains(">alpha<") && svg.contains(">b&quot;&lt;<"));
        assert!(render("a<&>b", false, vec![]).contains(">a&lt;&amp;&gt;b<"));
    }

    #[test]
    fn edge_cases() {
        let flat = vec![(1.0, 5.0), (2.0, 5.0), (3.0, 5.0)];
        let bad = vec![(f64::NAN, 1.0), (1.0, f64::INFINITY), (2.0, 3.0)];
        let huge = vec![(-f64::MAX, f64::MAX), (f64::MAX, f64::MIN_POSITIVE)];
        for log in [false, true] {
            render("", log, vec![]);
            let one = vec![("one", vec![(3.0, 7.0)])];
            assert_eq!(markers(&render("", log, one)), 1);
            assert_eq!(markers(&render("", log, vec![("flat", flat.clone())])), 3);
            render("", log, vec![("same x", vec![(1.0, 1.0), (1.0, 2.0)])]);
            render("", log, vec![("zeros", vec![(0.0, 0.0), (0.0, 0.0)])]);
            render("", log, vec![("empty", vec![])]);
            assert_eq!(markers(&render("", log, vec![("bad", bad.clone())])), 1);
            render("", log, vec![("huge", huge.clone())]);
        }
    }

    #[test]
    fn log_skips_non_positive() {
        let pts = vec![(1.0, -1.0), (2.0, 0.0), (3.0, 10.0), (4.0, 1000.0)];
        let svg = render("", true, vec![("s", pts)]);
        assert_eq!(markers(&svg), 2);
        assert!(svg.contains(">1k<") && svg.contains(">10<"));
    }

    #[test]
    fn ticks_are_nice() {
        let cases = [(0.0, 10.0), (3.0, 97.0), (1e-3, 4.2e-3), (-5.0, 1234.0)];
        for (lo, hi) in cases {
            let n = linear_axis((lo, hi)).ticks.len();
            assert!((5..=8).contains(&n), "{lo}..{hi}: {n}");
        }
        assert_eq!(label(1500.0, 500.0), "1.5k");
        assert_eq!(label(2e6, 1e6), "2M");
        assert_eq!(label(0.5, 0.1), "0.5");
        assert_eq!(label(12.0, 2.0), "12");
        let labels = |a: Axis| a.ticks.into_iter().map(|t| t.1).collect::<Vec<_>>();
        assert_eq!(
            labels(log_axis((1.0, 1e4))),
            ["1", "10", "100", "1k", "10k"]
        );
        // Under two decades the 2x and 5x steps appear too.
        assert_eq!(labels(log_axis((3.0, 40.0))), ["2", "5", "10", "20", "50"]);
    }
}
