//! Small SVG charts (lines with axes and a legend, horizontal bars); no plotting dependency.

use std::fmt::Write;

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// A chart of `series` with linear axes from 0; one colour per series.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (w, h, ml, mr, mt, mb) = (760.0, 440.0, 70.0, 210.0, 40.0, 55.0);
    let pts = series.iter().flat_map(|s| s.points.iter());
    let xmax = pts.clone().map(|p| p.0).fold(0.0, f64::max).max(1e-9) * 1.05;
    let ymax = pts.map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    let sx = |x: f64| ml + x / xmax * (w - ml - mr);
    let sy = |y: f64| h - mb - y / ymax * (h - mt - mb);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-size="13">{}</text>"#,
        esc(title)
    );
    for i in 0..=5 {
        let (xv, yv) = (xmax / 1.05 * i as f64 / 5.0, ymax / 1.1 * i as f64 / 5.0);
        let _ = write!(
            s,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#eee"/><text x="{x}" y="{}" text-anchor="middle">{}</text><line x1="{ml}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            mt,
            h - mb,
            h - mb + 16.0,
            fmt_num(xv),
            w - mr,
            ml - 6.0,
            sy(yv) + 4.0,
            fmt_num(yv),
            x = sx(xv),
            y = sy(yv),
        );
    }
    let _ = write!(
        s,
        r##"<line x1="{ml}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/><line x1="{ml}" y1="{mt}" x2="{ml}" y2="{b}" stroke="black"/><text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"##,
        (w - mr + ml) / 2.0,
        h - 12.0,
        esc(x_label),
        (h - mb + mt) / 2.0,
        esc(y_label),
        b = h - mb,
        r = w - mr,
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let dash = if se.dashed {
            r#" stroke-dasharray="5,4""#
        } else {
            ""
        };
        let path: Vec<String> = se
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        for &(x, y) in &se.points {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                sx(x),
                sy(y)
            );
        }
        let ly = mt + 10.0 + 18.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            w - mr + 12.0,
            w - mr + 36.0,
            w - mr + 42.0,
            ly + 4.0,
            esc(&se.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Horizontal bars from 0, one per label (for tables of schemes).
pub fn bar_chart(title: &str, value_label: &str, bars: &[(String, f64)]) -> String {
    let (w, ml, mr, mt, row) = (760.0, 170.0, 70.0, 40.0, 28.0);
    let h = mt + row * bars.len() as f64 + 40.0;
    let vmax = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9);
    let sx = |v: f64| v / vmax * (w - ml - mr);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-size="13">{}</text>"#,
        esc(title)
    );
    for (i, (label, v)) in bars.iter().enumerate() {
        let y = mt + row * i as f64;
        let _ = write!(
            s,
            r#"<rect x="{ml}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><text x="{:.1}" y="{:.1}">{}</text>"#,
            y + 4.0,
            sx(*v),
            row - 8.0,
            COLORS[i % COLORS.len()],
            ml - 8.0,
            y + row / 2.0 + 4.0,
            esc(label),
            ml + sx(*v) + 6.0,
            y + row / 2.0 + 4.0,
            fmt_num(*v)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text></svg>"#,
        (ml + w - mr) / 2.0,
        h - 12.0,
        esc(value_label)
    );
    s.push('\n');
    s
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_well_formed_svg() {
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
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("t &lt;1&gt;") && s.contains("a&amp;b") && s.contains("polyline"));
        let b = bar_chart("bars", "s", &[("x<y".into(), 2.0), ("z".into(), 1.0)]);
        assert!(b.starts_with("<svg") && b.trim_end().ends_with("</svg>"));
        assert_eq!(b.matches("<rect").count(), 3);
        assert!(b.contains("x&lt;y"));
    }
}
