use bmoe::engine::*;
use bmoe::llama::Sampling;
fn main() {
    let path = std::env::args().nth(1).unwrap_or("/tmp/t.gguf".into());
    let mode = std::env::args().nth(2).unwrap_or("res".into());
    let stream = match mode.as_str() { "res" => None, "s0" => Some(StreamOptions{cache_bytes:0, io_threads:1, o_direct:true}), _ => Some(StreamOptions{cache_bytes:200_000, io_threads:4, o_direct:true}) };
    let mut s = Session::open(SessionOptions{ model: path.into(), threads: 2, ctx_size: 512, batch: 512, ubatch: 512, n_expert_used: None, stream }).unwrap_or_else(|e| { eprintln!("{e}"); std::process::exit(1) });
    eprintln!("{:?}", s.info());
    let g = s.generate(&GenerateRequest{ prompt: "Hello world, this is a streaming test.".into(), n_predict: 32, sampling: Sampling::default(), continue_context: false, keep_logits: true}, &mut |_| {}).unwrap();
    println!("{}", g.text);
    let h: u64 = g.logits.iter().flatten().fold(0u64, |h, x| h.wrapping_mul(31).wrapping_add(x.to_bits() as u64));
    eprintln!("hash {h:x}\n{}", g.summary);
}
