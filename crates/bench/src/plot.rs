//! SVG charts through `plotters` (its SVG backend writes text as `<text>`, so no fonts are
//! needed): lines with a legend, horizontal bars, and heat maps with a labelled colour bar.
//! Axes get plotters' round tick values; an axis whose positive data spans two decades or
//! more is drawn logarithmic.

use std::ops::Range;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// Tick, axis and legend text (plotters draws SVG text at about 0.8 of the size asked).
const LABELS: (&str, u32) = ("sans-serif", 15);

/// Ratio of largest to smallest positive value from which an axis is logarithmic.
const LOG_SPAN: f64 = 100.0;

/// An axis for `values`: linear from 0 (or from the data's minimum when negative), or
/// logarithmic when every value is positive and they span `LOG_SPAN` or more.
enum Axis {
    Linear(Range<f64>),
    Log(Range<f64>),
}

impl Axis {
    fn of(values: impl Iterator<Item = f64> + Clone) -> Self {
        let finite = values.filter(|v| v.is_finite());
        let lo = finite.clone().fold(f64::INFINITY, f64::min);
        let hi = finite.fold(f64::NEG_INFINITY, f64::max);
        if !lo.is_finite() {
            return Axis::Linear(0.0..1.0);
        }
        if lo > 0.0 && hi / lo >= LOG_SPAN {
            return Axis::Log(lo / 1.5..hi * 1.5);
        }
        let lo = lo.min(0.0);
        let pad = ((hi - lo) * 0.08).max(1e-9);
        Axis::Linear(lo..hi + pad)
    }
}

type Drawn = Result<(), Box<dyn std::error::Error>>;

/// `draw` on a white SVG canvas of `size`; a failure becomes an SVG that says so.
fn svg(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Drawn,
) -> String {
    let mut out = String::new();
    let drawn = (|| -> Drawn {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
        Ok(())
    })();
    match drawn {
        Ok(()) => out,
        Err(e) => {
            let e = e.to_string().replace('&', "&amp;").replace('<', "&lt;");
            format!(
                "<svg xmlns=\"http://www.w3.org/2000/svg\"><text>plot failed: {e}</text></svg>\n"
            )
        }
    }
}

/// A chart of `series`, one colour per series, legend at the right.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    match (Axis::of(xs), Axis::of(ys)) {
        (Axis::Linear(x), Axis::Linear(y)) => lines(title, x_label, y_label, series, x, y),
        (Axis::Linear(x), Axis::Log(y)) => lines(title, x_label, y_label, series, x, y.log_scale()),
        (Axis::Log(x), Axis::Linear(y)) => lines(title, x_label, y_label, series, x.log_scale(), y),
        (Axis::Log(x), Axis::Log(y)) => lines(
            title,
            x_label,
            y_label,
            series,
            x.log_scale(),
            y.log_scale(),
        ),
    }
}

fn lines<X, Y>(title: &str, x_label: &str, y_label: &str, series: &[Series], x: X, y: Y) -> String
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    svg((760, 440), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .label_style(LABELS)
            .axis_desc_style(LABELS)
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.08))
            .x_desc(x_label)
            .y_desc(y_label)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()?;
        for (i, s) in series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let style = c.stroke_width(2);
            let pts = s
                .points
                .iter()
                .copied()
                .filter(|p| p.0.is_finite() && p.1.is_finite());
            let drawn = if s.dashed {
                chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?
            } else {
                chart.draw_series(LineSeries::new(pts.clone(), style))?
            };
            drawn
                .label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
            chart.draw_series(pts.map(|p| Circle::new(p, 3, c.filled())))?;
        }
        if series.iter().any(|s| !s.name.is_empty()) {
            legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        }
        Ok(())
    })
}

/// The series' legend box at `at`.
fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    at: SeriesLabelPosition,
) -> Drawn {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(at)
        .draw()?;
    Ok(())
}

/// One panel of a `timeline`: its own y axis over the shared x axis.
pub struct Panel {
    pub y_label: String,
    pub series: Vec<Series>,
}

/// Panels stacked over one x axis (time), with `events` (x, label) drawn as vertical lines
/// through every panel and labelled in the top one.
pub fn timeline(title: &str, x_label: &str, panels: &[Panel], events: &[(f64, String)]) -> String {
    let xs = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter().map(|q| q.0)))
        .chain(events.iter().map(|e| e.0));
    let x = match Axis::of(xs) {
        Axis::Linear(r) | Axis::Log(r) => r,
    };
    let height = 60 + 230 * panels.len() as u32;
    svg((900, height), |root| {
        let root = root.titled(title, ("sans-serif", 18))?;
        let areas = root.split_evenly((panels.len().max(1), 1));
        for (k, (panel, area)) in panels.iter().zip(&areas).enumerate() {
            let ys = panel
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|q| q.1));
            let y = match Axis::of(ys) {
                Axis::Linear(r) | Axis::Log(r) => r.start.min(0.0)..r.end,
            };
            let mut chart = ChartBuilder::on(area)
                .margin(10)
                .x_label_area_size(if k + 1 == panels.len() { 40 } else { 20 })
                .y_label_area_size(70)
                .build_cartesian_2d(x.clone(), y.clone())?;
            chart
                .configure_mesh()
                .label_style(LABELS)
                .axis_desc_style(LABELS)
                .light_line_style(WHITE.mix(0.0))
                .bold_line_style(BLACK.mix(0.08))
                .x_desc(if k + 1 == panels.len() { x_label } else { "" })
                .y_desc(panel.y_label.as_str())
                .x_label_formatter(&|v| tick(*v))
                .y_label_formatter(&|v| tick(*v))
                .draw()?;
            for (t, label) in events {
                chart.draw_series(DashedLineSeries::new(
                    [(*t, y.start), (*t, y.end)],
                    4,
                    4,
                    BLACK.mix(0.45).stroke_width(1),
                ))?;
                if k == 0 {
                    let grey = BLACK.mix(0.75);
                    let style = TextStyle::from(("sans-serif", 12).into_font())
                        .color(&grey)
                        .pos(Pos::new(HPos::Left, VPos::Top));
                    chart.draw_series(std::iter::once(Text::new(
                        label.clone(),
                        (*t, y.end),
                        style,
                    )))?;
                }
            }
            for (i, s) in panel.series.iter().enumerate() {
                let c = COLORS[i % COLORS.len()];
                let pts = s
                    .points
                    .iter()
                    .copied()
                    .filter(|p| p.0.is_finite() && p.1.is_finite());
                chart
                    .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2))
                    });
            }
            legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        }
        Ok(())
    })
}

/// Horizontal bars from 0, one per label (for tables of schemes), values printed at their ends.
pub fn bar_chart(title: &str, value_label: &str, bars: &[(String, f64)]) -> String {
    let n = bars.len().max(1);
    let vmax = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9) * 1.15;
    let height = 90 + 28 * n as u32;
    svg((760, height), |root| {
        let label = |y: &f64| {
            let i = y.floor() as usize;
            if *y >= 0.0 && (y - i as f64 - 0.5).abs() < 1e-6 && i < bars.len() {
                bars[bars.len() - 1 - i].0.clone()
            } else {
                String::new()
            }
        };
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(170)
            .build_cartesian_2d(0.0..vmax, 0.0..n as f64)?;
        chart
            .configure_mesh()
            .label_style(LABELS)
            .axis_desc_style(LABELS)
            .disable_y_mesh()
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.08))
            .x_desc(value_label)
            .x_label_formatter(&|v| tick(*v))
            .y_labels(2 * n + 1)
            .y_label_formatter(&label)
            .draw()?;
        // Top to bottom in the given order.
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let y = (bars.len() - 1 - i) as f64;
            Rectangle::new(
                [(0.0, y + 0.15), (*v, y + 0.85)],
                COLORS[i % COLORS.len()].filled(),
            )
        }))?;
        let at_end = TextStyle::from(LABELS.into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let y = (bars.len() - 1 - i) as f64 + 0.5;
            Text::new(tick(*v), (*v + vmax * 0.01, y), at_end.clone())
        }))?;
        Ok(())
    })
}

/// Steps in the colour bar.
const BAR_STEPS: usize = 50;

/// A heat map of `values[row][col]` in 0..1 (viridis: dark = low, bright = high), row 0 at the
/// bottom like a matrix plot of layers; `marks` are (row, col) cells outlined (e.g. matched
/// pairs); a colour bar at the right with its own axis.
pub fn heat_map(
    title: &str,
    row_label: &str,
    col_label: &str,
    values: &[Vec<f64>],
    marks: &[(usize, usize)],
) -> String {
    let rows = values.len().max(1);
    let cols = values.first().map_or(1, |r| r.len().max(1));
    let cell = (520 / rows.max(cols) as u32).clamp(6, 28);
    let (w, h) = (
        (cell * cols as u32 + 190).max(8 * title.chars().count() as u32),
        cell * rows as u32 + 110,
    );
    svg((w, h), |root| {
        let root = root.titled(title, ("sans-serif", 18))?;
        let (map, bar) = root.split_horizontally(w - 110);
        let mut chart = ChartBuilder::on(&map)
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(44)
            .build_cartesian_2d(0..cols, 0..rows)?;
        chart
            .configure_mesh()
            .label_style(LABELS)
            .axis_desc_style(LABELS)
            .disable_mesh()
            .x_desc(col_label)
            .y_desc(row_label)
            .draw()?;
        chart.draw_series(values.iter().enumerate().flat_map(|(r, row)| {
            row.iter()
                .enumerate()
                .map(move |(c, v)| Rectangle::new([(c, r), (c + 1, r + 1)], viridis(*v).filled()))
        }))?;
        chart.draw_series(marks.iter().filter(|(r, c)| *r < rows && *c < cols).map(
            |&(r, c)| {
                Rectangle::new(
                    [(c, r), (c + 1, r + 1)],
                    RGBColor(0xff, 0x20, 0x20).stroke_width(2),
                )
            },
        ))?;
        let mut scale = ChartBuilder::on(&bar)
            .margin_top(8)
            .margin_bottom(44)
            .margin_right(40)
            .margin_left(10)
            .right_y_label_area_size(36)
            .build_cartesian_2d(0.0..1.0, 0.0..1.0)?;
        scale
            .configure_mesh()
            .label_style(LABELS)
            .disable_mesh()
            .disable_x_axis()
            .y_labels(6)
            .y_label_formatter(&|v| format!("{v:.1}"))
            .draw()?;
        scale.draw_series((0..BAR_STEPS).map(|i| {
            let (a, b) = (
                i as f64 / BAR_STEPS as f64,
                (i + 1) as f64 / BAR_STEPS as f64,
            );
            Rectangle::new([(0.0, a), (1.0, b)], viridis((a + b) / 2.0).filled())
        }))?;
        Ok(())
    })
}

/// Tick text: no trailing zeros, thousands without decimals.
fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1000.0 || (a >= 1.0 && v.fract() == 0.0) {
        format!("{v:.0}")
    } else {
        // Two decimals above 1, else enough for two significant digits (log axes go low).
        let places = if a >= 1.0 {
            2
        } else {
            (1 - a.log10().floor() as i32).clamp(2, 12) as usize
        };
        let s = format!("{v:.places$}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Viridis from plotters' colour maps, clamped to 0..1 (non-finite values draw as 0).
fn viridis(v: f64) -> RGBColor {
    use plotters::style::colors::colormaps::{ColorMap, ViridisRGB};
    let v = if v.is_finite() {
        v.clamp(0.0, 1.0)
    } else {
        0.0
    };
    ViridisRGB.get_color(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_well_formed_svgs_with_escaped_text() {
        let s = line_chart(
            "t <1>",
            "x",
            "y",
            &[Series {
                name: "a&b".into(),
                points: vec![(0.0, 1.0), (2.0, 3.0)],
                dashed: true,
            }],
        );
        assert!(
            s.starts_with("<svg") && s.trim_end().ends_with("</svg>"),
            "{s}"
        );
        assert!(s.contains("t &lt;1&gt;") && s.contains("a&amp;b"), "{s}");
        let b = bar_chart("bars", "s", &[("x<y".into(), 2.0), ("z".into(), 1.0)]);
        assert!(b.starts_with("<svg") && b.trim_end().ends_with("</svg>"));
        assert!(b.contains("x&lt;y") && b.contains("\nz\n"), "{b}");
        let m = heat_map(
            "h",
            "llm",
            "slm",
            &[vec![0.0, 0.5], vec![1.0, 0.25]],
            &[(1, 0)],
        );
        assert!(m.starts_with("<svg") && m.trim_end().ends_with("</svg>"));
        // 4 cells and the colour bar's steps, filled; the mark outlined in red.
        assert!(m.matches("<rect").count() >= 4 + 1 + BAR_STEPS, "{m}");
        let top = viridis(1.0);
        let hex = format!("#{:02X}{:02X}{:02X}", top.0, top.1, top.2);
        assert!(
            m.contains(&hex),
            "the value-1 cell in the top colour of the ramp"
        );
    }

    #[test]
    fn ticks_are_round_numbers() {
        // Layer axes (0..24) get whole-number ticks, not 4.6, 9.2, ...
        let s = line_chart(
            "layers",
            "layer",
            "agreement",
            &[Series {
                name: "a".into(),
                points: (0..24).map(|l| (l as f64, 0.5 + l as f64 / 50.0)).collect(),
                dashed: false,
            }],
        );
        for t in ["0", "5", "10", "15", "20"] {
            assert!(s.contains(&format!("\n{t}\n</text>")), "no tick {t}");
        }
        assert!(!s.contains("\n4.6\n"));
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1500.4), "1500");
        assert_eq!(tick(2.50), "2.5");
        assert_eq!(tick(-0.0), "0");
        assert_eq!(tick(0.00012), "0.00012");
    }

    #[test]
    fn data_over_decades_gets_a_log_axis() {
        assert!(matches!(
            Axis::of([1.0, 10.0, 1000.0].into_iter()),
            Axis::Log(_)
        ));
        assert!(matches!(
            Axis::of([1.0, 10.0, 50.0].into_iter()),
            Axis::Linear(_)
        ));
        assert!(matches!(
            Axis::of([0.0, 10.0, 1000.0].into_iter()),
            Axis::Linear(_)
        ));
    }
}
