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

/// A heat map of `values[row][col]` in 0..1 (dark = low, bright = high), rows drawn bottom-up
/// like a matrix plot of layers; `marks` are (row, col) cells outlined (e.g. matched pairs).
pub fn heat_map(
    title: &str,
    row_label: &str,
    col_label: &str,
    values: &[Vec<f64>],
    marks: &[(usize, usize)],
) -> String {
    let rows = values.len();
    let cols = values.first().map_or(0, |r| r.len());
    let cell = (520.0 / rows.max(cols).max(1) as f64).clamp(6.0, 28.0);
    let (ml, mt) = (60.0, 40.0);
    // Wide enough for the title (about 6.5 px per character at 13 px).
    let w = (ml + cell * cols as f64 + 90.0).max(20.0 + 6.5 * title.chars().count() as f64);
    let h = mt + cell * rows as f64 + 50.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-size="13">{}</text>"#,
        esc(title)
    );
    let y_of = |r: usize| mt + cell * (rows - 1 - r) as f64;
    for (r, row) in values.iter().enumerate() {
        for (c, v) in row.iter().enumerate() {
            let _ = write!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{cell:.1}" height="{cell:.1}" fill="{}"><title>{r},{c}: {v:.3}</title></rect>"#,
                ml + cell * c as f64,
                y_of(r),
                viridis(*v)
            );
        }
        if r % 4 == 0 || r + 1 == rows {
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{r}</text>"#,
                ml - 4.0,
                y_of(r) + cell / 2.0 + 4.0
            );
        }
    }
    for c in (0..cols).filter(|c| c % 4 == 0 || c + 1 == cols) {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{c}</text>"#,
            ml + cell * (c as f64 + 0.5),
            mt + cell * rows as f64 + 14.0
        );
    }
    for &(r, c) in marks.iter().filter(|(r, c)| *r < rows && *c < cols) {
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{cell:.1}" height="{cell:.1}" fill="none" stroke="#ff2020" stroke-width="1.5"/>"##,
            ml + cell * c as f64,
            y_of(r)
        );
    }
    // Colour bar.
    let bx = ml + cell * cols as f64 + 20.0;
    for i in 0..20 {
        let v = 1.0 - i as f64 / 19.0;
        let _ = write!(
            s,
            r#"<rect x="{bx:.1}" y="{:.1}" width="14" height="{:.1}" fill="{}"/>"#,
            mt + i as f64 * cell * rows as f64 / 20.0,
            cell * rows as f64 / 20.0 + 0.5,
            viridis(v)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}">1</text><text x="{:.1}" y="{:.1}">0</text><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text></svg>"#,
        bx + 18.0,
        mt + 10.0,
        bx + 18.0,
        mt + cell * rows as f64,
        ml + cell * cols as f64 / 2.0,
        h - 12.0,
        esc(col_label),
        mt + cell * rows as f64 / 2.0,
        mt + cell * rows as f64 / 2.0,
        esc(row_label)
    );
    s.push('\n');
    s
}

/// A perceptual dark-blue -> green -> yellow ramp (viridis, a few stops interpolated).
fn viridis(v: f64) -> String {
    const STOPS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let v = if v.is_finite() {
        v.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let x = v * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |p: f64, q: f64| (p + (q - p) * f).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(a.0, b.0),
        mix(a.1, b.1),
        mix(a.2, b.2)
    )
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
        let m = heat_map(
            "h",
            "llm",
            "slm",
            &[vec![0.0, 0.5], vec![1.0, 0.25]],
            &[(1, 0)],
        );
        assert!(m.starts_with("<svg") && m.trim_end().ends_with("</svg>"));
        // 4 cells, 1 mark, 20 colour-bar steps, background.
        assert_eq!(m.matches("<rect").count(), 4 + 1 + 20 + 1);
        assert_eq!(viridis(0.0), "#440154");
        assert_eq!(viridis(1.0), "#fde725");
    }
}
