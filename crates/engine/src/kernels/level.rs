//! The kernel path: detected once per process, the one place that looks at the CPU.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Portable,
    /// AVX2 and F16C: the GEMM (`x86/gemm.rs`), attention, exp and activations in 8 lanes.
    Avx2,
    /// As `Avx2`, the GEMM's integer dots by AVX-512 VNNI on 256-bit vectors.
    Avx512Vnni,
    /// As `Avx512Vnni`, the GEMM on 512-bit vectors: tiles of two row groups (`x86/gemm_wide.rs`).
    Avx512,
    /// aarch64 ARMv8.0 Advanced SIMD: the GEMM's integer dots by widening multiplies
    /// (`arm/gemm.rs`), activation quantization, exp and gated activations in 4 lanes.
    Neon,
    /// As `Neon`, the integer dots by `sdot` (ARMv8.2 dot product).
    Dotprod,
    /// As `Dotprod`, tiles of two or more activation rows by `smmla` (ARMv8.6 i8mm).
    I8mm,
}

impl Level {
    /// Whether the GEMM runs tiled on repacked weights (every level but the scalar one).
    pub fn simd(self) -> bool {
        self != Level::Portable
    }

    /// Whether the x86 AVX2 (8-lane) paths run: every x86 SIMD level.
    pub fn avx2(self) -> bool {
        matches!(self, Level::Avx2 | Level::Avx512Vnni | Level::Avx512)
    }

    /// Whether the GEMM's integer dots are `vpdpbusd` (either width).
    pub fn vnni(self) -> bool {
        matches!(self, Level::Avx512Vnni | Level::Avx512)
    }

    /// Whether the 512-bit paths run.
    pub fn wide(self) -> bool {
        self == Level::Avx512
    }

    /// Whether the aarch64 Advanced SIMD paths run.
    pub fn neon(self) -> bool {
        matches!(self, Level::Neon | Level::Dotprod | Level::I8mm)
    }

    /// The path's name in benchmark results.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512Vnni => "avx512vnni-256",
            Level::Avx512 => "avx512",
            Level::Neon => "neon",
            Level::Dotprod => "dotprod",
            Level::I8mm => "i8mm",
        }
    }

    /// The levels below this one that this CPU can also run (and that tests compare).
    pub fn below(self) -> Vec<Level> {
        match self {
            Level::Avx512 => vec![Level::Avx2, Level::Avx512Vnni],
            Level::Avx512Vnni => vec![Level::Avx2],
            Level::I8mm => vec![Level::Neon, Level::Dotprod],
            Level::Dotprod => vec![Level::Neon],
            _ => Vec::new(),
        }
    }
}

/// The kernel path this CPU runs, detected once. `EDGEPROMPT_PORTABLE` forces the scalar one;
/// to compare the paths, `EDGEPROMPT_AVX2` forces the AVX2 one on a VNNI machine,
/// `EDGEPROMPT_256` the 256-bit VNNI one on an AVX-512 machine, `EDGEPROMPT_NEON` the ARMv8.0
/// one and `EDGEPROMPT_DOTPROD` the `sdot` one on an aarch64 CPU that has more.
pub static LEVEL: std::sync::LazyLock<Level> = std::sync::LazyLock::new(|| {
    if std::env::var_os("EDGEPROMPT_PORTABLE").is_some() {
        return Level::Portable;
    }
    detect().unwrap_or(Level::Portable)
});

#[cfg(target_arch = "x86_64")]
fn detect() -> Option<Level> {
    if !(is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c"))
    {
        return None;
    }
    let vnni = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    if !vnni || std::env::var_os("EDGEPROMPT_AVX2").is_some() {
        return Some(Level::Avx2);
    }
    if !is_x86_feature_detected!("avx512bw") || std::env::var_os("EDGEPROMPT_256").is_some() {
        return Some(Level::Avx512Vnni);
    }
    Some(Level::Avx512)
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Option<Level> {
    use std::arch::is_aarch64_feature_detected as has;
    // Advanced SIMD is part of every aarch64 Linux target.
    if !has!("dotprod") || std::env::var_os("EDGEPROMPT_NEON").is_some() {
        return Some(Level::Neon);
    }
    if !has!("i8mm") || std::env::var_os("EDGEPROMPT_DOTPROD").is_some() {
        return Some(Level::Dotprod);
    }
    Some(Level::I8mm)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Option<Level> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detected_level_is_one_this_cpu_runs() {
        if std::env::var_os("EDGEPROMPT_PORTABLE").is_none() {
            #[cfg(target_arch = "x86_64")]
            assert_eq!(LEVEL.avx2(), is_x86_feature_detected!("avx2"));
            #[cfg(target_arch = "aarch64")]
            assert!(LEVEL.neon());
        }
        assert!(!LEVEL.below().contains(&LEVEL));
        // The emulation script (`scripts/aarch64.sh`) names the path each CPU model must get.
        if let Ok(want) = std::env::var("EDGEPROMPT_EXPECT_LEVEL") {
            assert_eq!(LEVEL.name(), want);
        }
    }
}
