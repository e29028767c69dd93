//! `bmoe kernels`: which CPU matmul kernels of the linked llama.cpp give a
//! column the same bits whatever the width of the call.

use std::fmt::Write as _;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

use crate::gguf::GgmlType;
use crate::llama::kernels::{KernelFamily, ProbeCase, ProbeOp, choose_tiled_matmul, probe, type_name};

/// Whether ggml's tiled K-quant matmul may run (`GGML_CPU_TILED_MM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tiled {
    /// As the environment says (llama.cpp's default: on).
    Env,
    /// On: K-quant matmuls of enough columns take the tiled kernel.
    On,
    /// Off: they take `vec_dot`.
    Off,
}

/// Probes the kernels.
#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// Weight types to probe.
    #[arg(long, value_delimiter = ',', default_value = "f32,f16,bf16,q8_0,q4_0,iq4_nl,mxfp4,q2_K,q4_K,q5_K,q6_K")]
    pub types: Vec<String>,
    /// Call widths (columns) to compare with each column computed alone.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,7,8,9,16,17,64")]
    pub widths: Vec<i64>,
    /// Output rows of the probed weight.
    #[arg(long, default_value_t = 256)]
    pub rows: i64,
    /// Inner dimension of the probed weight (a multiple of 256 suits every type).
    #[arg(long, default_value_t = 2048)]
    pub k: i64,
    /// Compute threads (default: the machine's cores).
    #[arg(short = 't', long)]
    pub threads: Option<i32>,
    /// Compute each solo column as the first of this many copies of itself in
    /// one call (2 shows whether padding a lone column into llamafile's sgemm
    /// gives it the bits of a wider call).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=64))]
    pub pad: i64,
    /// ggml's tiled K-quant matmul for the plain family (the process's first matmul decides).
    #[arg(long, value_enum, default_value_t = Tiled::Env)]
    pub tiled: Tiled,
}

/// Runs `bmoe kernels`.
pub fn kernels(args: KernelsArgs) -> Result<()> {
    if let Some(bad) = args.widths.iter().find(|w| !(1..=4096).contains(*w)) {
        bail!("--widths {bad}: a width must be 1 to 4096 columns");
    }
    if !(1..=1 << 16).contains(&args.rows) || !(256..=1 << 16).contains(&args.k) || args.k % 256 != 0 {
        bail!("--rows must be 1 to 65536 and --k a multiple of 256 up to 65536");
    }
    let widest = args.widths.iter().copied().max().unwrap_or(1);
    if args.rows * args.k > 1 << 26 || widest.max(args.pad) * args.k > 1 << 26 {
        bail!("--rows x --k and the widest width x --k must each stay within 67,108,864 values (256 MiB of f32)");
    }
    let mut types = Vec::new();
    for name in &args.types {
        match GgmlType::from_name(name) {
            Some(t) => types.push(t.id()),
            None => bail!("--types {name}: not a ggml type name (f16, q8_0, q4_K, ...)"),
        }
    }
    let tiled = match args.tiled {
        Tiled::Env => std::env::var("GGML_CPU_TILED_MM").map_or(true, |v| v.trim().parse::<i32>() != Ok(0)),
        Tiled::On => true,
        Tiled::Off => false,
    };
    if args.tiled != Tiled::Env {
        choose_tiled_matmul(tiled);
    }
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as i32));
    let features = crate::llama::cpu_features();
    let llamafile = features.split(' ').any(|f| f == "LLAMAFILE");
    println!("llama.cpp CPU: {features}");
    println!(
        "plain: vec_dot{}{}; repacked: the CPU_REPACK layout's gemm (4 columns at a time) and gemv; reference: vec_dot \
         only; sgemm-all: reference mode with the sgemm from 2 columns and a matvec in its order for 1",
        if llamafile { ", llamafile's sgemm from 2 columns" } else { " (llamafile's sgemm not built)" },
        if tiled { ", the tiled K-quant matmul where it pays" } else { " (tiled K-quant matmul off)" },
    );
    println!("weight {} x {}, {threads} threads, widths {:?}", args.rows, args.k, args.widths);
    if args.pad > 1 {
        println!(
            "a width is listed where some column's bits differ from the same column computed in a call of {} copies of itself\n",
            args.pad
        );
    } else {
        println!("a width is listed where some column's bits differ from the same column computed alone\n");
    }
    let mut table = String::new();
    let _ = writeln!(table, "{:<8} {:<7} {:<10} result", "type", "op", "family");
    for &type_id in &types {
        for op in [ProbeOp::MulMat, ProbeOp::MulMatId] {
            for family in
                [KernelFamily::Plain, KernelFamily::Repacked, KernelFamily::Reference, KernelFamily::InvariantSgemm]
            {
                let case = ProbeCase { type_id, rows: args.rows, k: args.k, family, op, threads, pad: args.pad };
                let op_name = if op == ProbeOp::MulMat { "dense" } else { "experts" };
                let result = match probe(&case, &args.widths) {
                    Ok(r) if !r.layout_taken && family == KernelFamily::InvariantSgemm => {
                        "not taken (f16 and f32 dense weights, x86-64 builds with llamafile's sgemm)".to_string()
                    }
                    Ok(r) if !r.layout_taken => "no repacked layout on this CPU".to_string(),
                    Ok(r) => match r.differing_widths() {
                        d if d.is_empty() => "same bits at every width".to_string(),
                        d => format!("differs at {}", d.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")),
                    },
                    Err(e) => format!("not probed: {e}"),
                };
                let _ = writeln!(table, "{:<8} {:<7} {:<10} {result}", type_name(type_id), op_name, family.name());
            }
        }
    }
    print!("{table}");
    Ok(())
}
