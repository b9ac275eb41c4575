//! The embedded clearing policy resolves the expected method for real CPU identities, given
//! as fixed CPUID register values (not the host's), and resolves the host to some rule.

use hugeprep::clear::Method;
use hugeprep::cpu::{CpuInfo, CpuidTable, Feature, LlcSource, Vendor};
use hugeprep::policy::{
    CalibrationMode, ClearingPolicy, Confidence, DecidedBy, BUILTIN_FALLBACK_RULE,
};

const INTEL: &[u8; 12] = b"GenuineIntel";
const AMD: &[u8; 12] = b"AuthenticAMD";
const HYGON: &[u8; 12] = b"HygonGenuine";

// CPUID.7.0 bits.
const AVX2: u32 = 1 << 5;
const ERMS: u32 = 1 << 9;
const AVX512F: u32 = 1 << 16;
const AVX512BW: u32 = 1 << 30;
const AVX512VL: u32 = 1 << 31;
const AVX512: u32 = AVX512F | AVX512BW | AVX512VL;
const FSRM_EDX: u32 = 1 << 4;
const AVX512FP16_EDX: u32 = 1 << 23;
const AMX_TILE_EDX: u32 = 1 << 24;
const MOVDIR64B_ECX: u32 = 1 << 28;

/// One CPU as its CPUID registers describe it.
struct Identity {
    name: &'static str,
    vendor: &'static [u8; 12],
    brand: &'static str,
    /// CPUID.1:EAX.
    signature: u32,
    leaf7_ebx: u32,
    leaf7_ecx: u32,
    leaf7_edx: u32,
    clzero: bool,
    /// (ways, sets) of the L3 in the deterministic cache leaf, 64-byte lines.
    l3: (u32, u32),
    // What the policy must choose.
    family: u32,
    model: u32,
    stepping: u32,
    rule: &'static str,
    method: Method,
}

impl Identity {
    fn l3_bytes(&self) -> u64 {
        u64::from(self.l3.0) * u64::from(self.l3.1) * 64
    }

    /// The registers a real CPU of this kind returns for the leaves hugeprep reads.
    fn cpuid(&self) -> CpuidTable {
        let word = |i: usize| u32::from_le_bytes(self.vendor[i..i + 4].try_into().unwrap());
        let amd_like = self.vendor != INTEL;
        let (max_leaf, max_ext) = if amd_like {
            (0x10, 0x8000_0021)
        } else {
            (0x1b, 0x8000_0008)
        };
        // Deterministic cache parameters: Intel leaf 4, AMD leaf 0x8000001D.
        let cache_leaf = if amd_like { 0x8000_001d } else { 4 };
        let cache = |kind: u32, level: u32, ways: u32, sets: u32| {
            [
                kind | (level << 5) | (1 << 8),
                ((ways - 1) << 22) | 63,
                sets - 1,
                0,
            ]
        };
        // Leaf 1 EDX: SSE2 (26); ECX: AVX (28), OSXSAVE (27).
        let leaf1 = [self.signature, 0x0010_0800, (1 << 28) | (1 << 27), 1 << 26];
        CpuidTable::new()
            .leaf(0, 0, [max_leaf, word(0), word(8), word(4)])
            .leaf(1, 0, leaf1)
            .leaf(7, 0, [0, self.leaf7_ebx, self.leaf7_ecx, self.leaf7_edx])
            .leaf(cache_leaf, 0, cache(1, 1, 12, 64)) // 48 KiB L1d
            .leaf(cache_leaf, 1, cache(2, 1, 8, 64)) // 32 KiB L1i
            .leaf(cache_leaf, 2, cache(3, 2, 16, 1024)) // 1 MiB L2
            .leaf(cache_leaf, 3, cache(3, 3, self.l3.0, self.l3.1))
            .leaf(0x8000_0000, 0, [max_ext, 0, 0, 0])
            .leaf(0x8000_0001, 0, [self.signature, 0, 0, 1 << 29])
            .leaf(0x8000_0008, 0, [0x3030, u32::from(self.clzero), 0, 0])
            .brand(self.brand)
    }
}

/// The masked Intel Xeon VM of issue 9: signature 0x000a0671 (family 6 model 0xa7, a client
/// model number, stepping 1), AVX-512F/BW/VL, AVX512-FP16, AMX, MOVDIR64B, FSRM, a 480 MiB
/// LLC in CPUID, brand "Intel(R) Xeon(R) Processor". Measured there: rep stosb 8.5-10.5 GB/s
/// with 1 thread against avx512-nt 22-25, so the policy must pick avx512-nt.
fn masked_xeon() -> Identity {
    Identity {
        name: "Sapphire Rapids class Xeon, model masked (VM)",
        vendor: INTEL,
        brand: "Intel(R) Xeon(R) Processor",
        signature: 0x000a_0671,
        leaf7_ebx: AVX2 | ERMS | AVX512,
        leaf7_ecx: MOVDIR64B_ECX,
        leaf7_edx: FSRM_EDX | AVX512FP16_EDX | AMX_TILE_EDX,
        clzero: false,
        l3: (15, 524288), // 480 MiB
        family: 6,
        model: 0xa7,
        stepping: 1,
        rule: "intel-server-amx",
        method: Method::Avx512Nt,
    }
}

fn identities() -> Vec<Identity> {
    vec![
        Identity {
            name: "Skylake-SP",
            vendor: INTEL,
            brand: "Intel(R) Xeon(R) Platinum 8180 CPU @ 2.50GHz",
            signature: 0x0005_0654,
            leaf7_ebx: AVX2 | ERMS | AVX512,
            leaf7_ecx: 0,
            leaf7_edx: 0,
            clzero: false,
            l3: (11, 57344), // 38.5 MiB
            family: 6,
            model: 85,
            stepping: 4,
            rule: "intel-skylake-server",
            method: Method::RepStosb,
        },
        Identity {
            name: "Cascade Lake",
            vendor: INTEL,
            brand: "Intel(R) Xeon(R) Platinum 8280 CPU @ 2.70GHz",
            signature: 0x0005_0657,
            leaf7_ebx: AVX2 | ERMS | AVX512,
            leaf7_ecx: 0,
            leaf7_edx: 0,
            clzero: false,
            l3: (11, 57344),
            family: 6,
            model: 85,
            stepping: 7,
            rule: "intel-skylake-server",
            method: Method::RepStosb,
        },
        Identity {
            name: "client Skylake",
            vendor: INTEL,
            brand: "Intel(R) Core(TM) i7-6700K CPU @ 4.00GHz",
            signature: 0x0005_06e3,
            leaf7_ebx: AVX2 | ERMS,
            leaf7_ecx: 0,
            leaf7_edx: 0,
            clzero: false,
            l3: (16, 8192), // 8 MiB
            family: 6,
            model: 94,
            stepping: 3,
            rule: "intel-skylake-client",
            method: Method::RepStosb,
        },
        Identity {
            name: "Coffee Lake",
            vendor: INTEL,
            brand: "Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz",
            signature: 0x0009_06ea,
            leaf7_ebx: AVX2 | ERMS,
            leaf7_ecx: 0,
            leaf7_edx: 0,
            clzero: false,
            l3: (12, 16384), // 12 MiB
            family: 6,
            model: 0x9e,
            stepping: 10,
            rule: "intel-skylake-client-derivatives",
            method: Method::RepStosb,
        },
        Identity {
            name: "Ice Lake-SP",
            vendor: INTEL,
            brand: "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz",
            signature: 0x0006_06a6,
            leaf7_ebx: AVX2 | ERMS | AVX512,
            leaf7_ecx: 0,
            leaf7_edx: FSRM_EDX,
            clzero: false,
            l3: (12, 81920), // 60 MiB
            family: 6,
            model: 106,
            stepping: 6,
            rule: "intel-xeon-avx512-nt",
            method: Method::Avx512Nt,
        },
        Identity {
            name: "Sapphire Rapids",
            vendor: INTEL,
            brand: "Intel(R) Xeon(R) Platinum 8480+",
            signature: 0x0008_06f8,
            leaf7_ebx: AVX2 | ERMS | AVX512,
            leaf7_ecx: MOVDIR64B_ECX,
            leaf7_edx: FSRM_EDX,
            clzero: false,
            l3: (15, 114688), // 105 MiB
            family: 6,
            model: 143,
            stepping: 8,
            rule: "intel-xeon-avx512-nt",
            method: Method::Avx512Nt,
        },
        masked_xeon(),
        Identity {
            name: "Sapphire Rapids class, AMX hidden (VM)",
            leaf7_edx: FSRM_EDX | AVX512FP16_EDX,
            rule: "intel-server-avx512fp16",
            ..masked_xeon()
        },
        Identity {
            name: "Zen 2 (Rome)",
            vendor: AMD,
            brand: "AMD EPYC 7742 64-Core Processor",
            signature: 0x0083_0f10,
            leaf7_ebx: AVX2,
            leaf7_ecx: 0,
            leaf7_edx: 0,
            clzero: true,
            l3: (16, 16384), // 16 MiB per CCX
            family: 23,
            model: 49,
            stepping: 0,
            rule: "amd-zen1-zen2",
            method: Method::Clzero,
        },
        Identity {
            name: "Zen 3 (Milan)",
            vendor: AMD,
            brand: "AMD EPYC 7763 64-Core Processor",
            signature: 0x00a0_0f11,
            leaf7_ebx: AVX2 | ERMS,
            leaf7_ecx: 0,
            leaf7_edx: FSRM_EDX,
            clzero: true,
            l3: (16, 32768), // 32 MiB per CCD
            family: 25,
            model: 1,
            stepping: 1,
            rule: "amd-zen3",
            method: Method::Clzero,
        },
        Identity {
            name: "Zen 4 (Genoa)",
            vendor: AMD,
            brand: "AMD EPYC 9654 96-Core Processor",
            signature: 0x00a1_0f11,
            leaf7_ebx: AVX2 | ERMS | AVX512,
            leaf7_ecx: 0,
            leaf7_edx: FSRM_EDX,
            clzero: true,
            l3: (16, 32768),
            family: 25,
            model: 17,
            stepping: 1,
            rule: "amd-zen4",
            method: Method::Avx512Nt,
        },
        Identity {
            name: "Zen 5 (Turin)",
            vendor: AMD,
            brand: "AMD EPYC 9575F 64-Core Processor",
            signature: 0x00b0_0f21,
            leaf7_ebx: AVX2 | ERMS | AVX512,
            leaf7_ecx: MOVDIR64B_ECX,
            leaf7_edx: FSRM_EDX,
            clzero: true,
            l3: (16, 32768),
            family: 26,
            model: 2,
            stepping: 1,
            rule: "amd-zen5",
            method: Method::Avx512Nt,
        },
        // A VM that hides AVX-512 from a Genoa host: the avx512-nt rule cannot match.
        Identity {
            name: "Zen 4 without AVX-512 (VM)",
            vendor: AMD,
            brand: "AMD EPYC 9654 96-Core Processor",
            signature: 0x00a1_0f11,
            leaf7_ebx: AVX2 | ERMS,
            leaf7_ecx: 0,
            leaf7_edx: FSRM_EDX,
            clzero: true,
            l3: (16, 32768),
            family: 25,
            model: 17,
            stepping: 1,
            rule: "amd-clzero",
            method: Method::Clzero,
        },
        Identity {
            name: "Granite Rapids without AVX-512 (VM)",
            vendor: INTEL,
            brand: "Intel(R) Xeon(R) 6980P",
            signature: 0x000a_06d1,
            leaf7_ebx: AVX2 | ERMS,
            leaf7_ecx: MOVDIR64B_ECX,
            leaf7_edx: FSRM_EDX,
            clzero: false,
            l3: (16, 516096), // 504 MiB
            family: 6,
            model: 173,
            stepping: 1,
            rule: "intel-xeon-avx2-nt",
            method: Method::Avx2Nt,
        },
        Identity {
            name: "Alder Lake (no rule of its own)",
            vendor: INTEL,
            brand: "12th Gen Intel(R) Core(TM) i9-12900K",
            signature: 0x0009_0672,
            leaf7_ebx: AVX2 | ERMS,
            leaf7_ecx: MOVDIR64B_ECX,
            leaf7_edx: FSRM_EDX,
            clzero: false,
            l3: (10, 49152), // 30 MiB
            family: 6,
            model: 151,
            stepping: 2,
            rule: "generic-erms",
            method: Method::RepStosb,
        },
        Identity {
            name: "Hygon Dhyana",
            vendor: HYGON,
            brand: "Hygon C86 7185 32-core Processor",
            signature: 0x0090_0f01,
            leaf7_ebx: AVX2,
            leaf7_ecx: 0,
            leaf7_edx: 0,
            clzero: true,
            l3: (16, 8192),
            family: 24,
            model: 0,
            stepping: 1,
            rule: "hygon-dhyana",
            method: Method::Clzero,
        },
    ]
}

#[test]
fn cpuid_values_decode_to_the_real_identity() {
    for id in identities() {
        let cpu = CpuInfo::from_cpuid(id.cpuid());
        assert_eq!(
            (cpu.family, cpu.model, cpu.stepping),
            (id.family, id.model, id.stepping),
            "{}",
            id.name
        );
        assert_eq!(cpu.signature, id.signature, "{}", id.name);
        assert_eq!(cpu.brand, id.brand, "{}", id.name);
        assert_eq!(cpu.llc_bytes, Some(id.l3_bytes()), "{}", id.name);
        assert_eq!(cpu.llc_source, LlcSource::Cpuid, "{}", id.name);
        assert_eq!(cpu.has(Feature::Clzero), id.clzero, "{}", id.name);
        for (feature, expected) in [
            (Feature::Avx512f, id.leaf7_ebx & AVX512F != 0),
            (Feature::Erms, id.leaf7_ebx & ERMS != 0),
            (Feature::Fsrm, id.leaf7_edx & FSRM_EDX != 0),
            (Feature::Movdir64b, id.leaf7_ecx & MOVDIR64B_ECX != 0),
            (Feature::Amx, id.leaf7_edx & AMX_TILE_EDX != 0),
            (Feature::Avx512fp16, id.leaf7_edx & AVX512FP16_EDX != 0),
        ] {
            assert_eq!(cpu.has(feature), expected, "{} {feature:?}", id.name);
        }
        let vendor = match id.vendor {
            INTEL => Vendor::Intel,
            AMD => Vendor::Amd,
            _ => Vendor::Other("HygonGenuine".into()),
        };
        assert_eq!(cpu.vendor, vendor, "{}", id.name);
    }
}

#[test]
fn embedded_policy_resolves_each_real_cpu_to_its_rule() {
    let policy = ClearingPolicy::embedded();
    for id in identities() {
        let cpu = CpuInfo::from_cpuid(id.cpuid());
        let r = policy.resolve(&cpu);
        assert_eq!(
            (r.rule.as_str(), r.plan.method),
            (id.rule, id.method),
            "{} ({cpu})",
            id.name
        );
        assert_eq!(r.decided_by, DecidedBy::Rule);
        assert!(!r.source.is_empty());
        // nt_min_extent = "llc" in the embedded defaults.
        assert_eq!(r.plan.nt_min_extent as u64, id.l3_bytes(), "{}", id.name);
        assert_eq!(r.plan.fence_interval, 2 << 20);
    }
}

#[test]
fn every_chosen_method_is_one_the_cpu_can_run() {
    let policy = ClearingPolicy::embedded();
    for id in identities() {
        let cpu = CpuInfo::from_cpuid(id.cpuid());
        let rule = policy
            .matching_rule(&cpu)
            .expect("embedded policy has catch-alls");
        assert!(
            cpu.features.contains_all(rule.required_features()),
            "{}: {} needs {}",
            id.name,
            rule.name,
            rule.required_features()
        );
    }
}

#[test]
fn a_cpu_without_cpuid_leaves_falls_to_the_generic_rule() {
    let cpu = CpuInfo::from_cpuid(CpuidTable::new());
    assert_eq!(cpu.vendor, Vendor::Other(String::new()));
    assert_eq!(cpu.llc_bytes, None);
    let r = ClearingPolicy::embedded().resolve(&cpu);
    assert_eq!(
        (r.rule.as_str(), r.plan.method),
        ("generic-movnti", Method::Movnti)
    );
    assert_eq!(r.plan.nt_min_extent, hugeprep::policy::FALLBACK_LLC_BYTES);
}

#[test]
fn host_resolves_to_a_rule() {
    let cpu = CpuInfo::host();
    let r = ClearingPolicy::embedded().resolve(cpu);
    assert_ne!(r.rule, BUILTIN_FALLBACK_RULE, "{cpu}");
    eprintln!("host {cpu}: rule {} -> {}", r.rule, r.plan.method);
    // This project's machines: AMD EPYC (Zen 4 or 5) with AVX-512 and CLZERO.
    if cpu.vendor == Vendor::Amd && cpu.family >= 0x19 && cpu.has(Feature::Avx512f) {
        assert!(
            matches!(r.plan.method, Method::Avx512Nt | Method::Clzero),
            "{cpu}: {r:?}"
        );
    }
    // On the host the LLC size is cross-checked with sysfs.
    assert_ne!(cpu.llc_source, LlcSource::Unknown, "{cpu}");
}

/// The masked Xeon of issue 9 picks avx512-nt by its features, not rep stosb through the
/// generic ERMS fallback; as a feature rule it is a guess, which `auto` calibration replaces
/// when another method is clearly faster and keeps when it is the fastest, as measured there.
#[test]
fn masked_sapphire_rapids_class_xeon_picks_avx512_nt_by_features() {
    let cpu = CpuInfo::from_cpuid(masked_xeon().cpuid());
    assert_eq!(cpu.signature, 0x000a_0671);
    assert_eq!((cpu.family, cpu.model, cpu.stepping), (6, 0xa7, 1));
    assert_eq!(cpu.llc_bytes, Some(480 << 20));
    for f in [
        Feature::Avx512f,
        Feature::Avx512bw,
        Feature::Avx512vl,
        Feature::Avx512fp16,
        Feature::Amx,
        Feature::Movdir64b,
        Feature::Fsrm,
        Feature::Erms,
    ] {
        assert!(cpu.has(f), "{f}");
    }
    let policy = ClearingPolicy::embedded();
    let mut r = policy.resolve(&cpu);
    assert_eq!(
        (r.rule.as_str(), r.method(), r.confidence),
        ("intel-server-amx", Method::Avx512Nt, Confidence::Guess)
    );
    // The measurements from that machine (GB/s, 1 thread, 3 rounds): avx512-nt stays.
    let measured = [
        (Method::RepStosb, 9.5),
        (Method::Movnti, 12.0),
        (Method::Avx2Nt, 21.0),
        (Method::Avx512Nt, 23.5),
    ];
    r.apply_calibration(CalibrationMode::Auto, &measured, None);
    assert_eq!(
        (r.method(), r.decided_by),
        (Method::Avx512Nt, DecidedBy::Rule)
    );
    // Scrubs stream whatever the 480 MiB LLC says; only use-soon clears below it are cached.
    assert_eq!(r.plan.nt_min_extent, 480 << 20);
    assert_eq!(r.plan.method_for(64 << 20), Method::Avx512Nt);
    let soon = r.plan.for_purpose(hugeprep::clear::ClearPurpose::UseSoon);
    assert_eq!(soon.method_for(64 << 20), Method::RepStosb);
}

/// Every rule says how sure it is, and the ones for known models say so in their source.
#[test]
fn embedded_rules_carry_a_confidence() {
    let policy = ClearingPolicy::embedded();
    assert_eq!(policy.calibration(), CalibrationMode::Auto);
    let confidence = |name: &str| {
        policy
            .rules()
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.confidence)
    };
    assert_eq!(confidence("amd-zen5"), Some(Confidence::Measured));
    assert_eq!(confidence("amd-zen3"), Some(Confidence::Published));
    assert_eq!(
        confidence("intel-skylake-server"),
        Some(Confidence::Published)
    );
    for fallback in ["generic-erms", "amd-clzero", "intel-server-amx", "amd-zen4"] {
        assert_eq!(confidence(fallback), Some(Confidence::Guess), "{fallback}");
    }
}
