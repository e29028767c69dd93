//! Concurrent requests in one batch: each request takes a slot (a
//! sequence of the session), and every decode step is one batch holding
//! each generating slot's next token and, in the room left, chunks of
//! newcomers' prompts (oldest request first). While streams are running
//! the prompt tokens a step carries are held to the budget the [`Pacer`]
//! sizes, so a long prompt does not stall them.
//! The expert hook serves the batch's union of routes once per layer.
//! Each slot keeps its tokens after its request, so a conversation's next
//! turn (its longest cached prefix, copied to its slot where another holds
//! it) decodes only what is new. The running slots are kept in one block of
//! consecutive sequences ([`super::placement`]) and a batch lists them in
//! order, so a step is one pass over the weights.

use std::sync::mpsc::{Receiver, TryRecvError};

use super::engine::{Engine, Finished, Job, Out, finish_reason, host_error, step_json};
use super::error::ApiError;
use super::logprobs::{TokenLogprob, token_logprob};
use super::pace::{Pacer, StepCost};
use super::placement::{MIN_REUSE, gather, place};
use super::request::{CompletionPrompt, Work};
use crate::engine::{Generation, Phase, Utf8Stream};
use crate::host::{Host, HostEvent, Reply};
use crate::llama::{Model, Sampler};

/// One request in a slot.
struct Slot<'m> {
    job: Job,
    /// Its place in the order requests started.
    arrival: u64,
    reply: Reply,
    sampler: Sampler<'m>,
    /// Prompt tokens not yet decoded.
    input: Vec<i32>,
    /// The last generated token, decoded with the next step.
    pending: Option<i32>,
    generation: Generation,
    utf8: Utf8Stream,
    /// Tool calls in the conversation before this reply (for call ids).
    called_before: usize,
    /// Each generated token's log-probability, when the request asked.
    logprobs: Vec<TokenLogprob>,
    /// Each step's logits digest, when the request asked.
    digests: Vec<u64>,
}

/// How a slot's step ended.
enum Next {
    Continue,
    Done,
}

/// Serves jobs `slots` at a time until every sender is gone.
pub fn run(mut host: Host, inbox: &Receiver<Job>, engine: &Engine, slots: usize) {
    let model = host.session_mut().model().clone();
    let batch = host.config().generate.batch.max(1) as usize;
    let mut pacer = Pacer::new(host.config().serve.step_target);
    let mut running: Vec<Option<Slot<'_>>> = (0..slots).map(|_| None).collect();
    let mut step = 0u32;
    let mut arrivals = 0u64;
    loop {
        // The server stops: what runs ends now, with an error saying so.
        if engine.stopping() {
            for slot in running.iter_mut() {
                if let Some(slot) = slot.take() {
                    let _ = slot.job.out.send(Out::Done(Err(Engine::stopped_error())));
                }
            }
        }
        // Take new jobs while slots are free; wait only when none runs.
        while running.iter().any(Option::is_none) {
            let job = if running.iter().all(Option::is_none) {
                match inbox.recv() {
                    Ok(job) => job,
                    Err(_) => return,
                }
            } else {
                match inbox.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            };
            if !engine.admit(&job) {
                continue;
            }
            if engine.stopping() {
                refuse(job, Engine::stopped_error());
                continue;
            }
            arrivals += 1;
            start(&mut host, engine, &model, job, arrivals, &mut running);
        }
        gather_slots(&mut host, engine, &mut running);
        // One batch: each generating slot's token, then prompt chunks.
        let mut parts: Vec<(usize, Vec<i32>, bool)> = Vec::new();
        for (seq, slot) in running.iter().enumerate() {
            if let Some(token) = slot.as_ref().and_then(|s| s.pending) {
                parts.push((seq, vec![token], true));
            }
        }
        let decoding = parts.len();
        let room = batch.saturating_sub(decoding);
        let joining = running.iter().flatten().filter(|s| !s.input.is_empty()).count();
        let budget = pacer.budget(decoding, joining).filter(|&b| b < room);
        let prompt = take_prompt_chunks(&mut running, budget.unwrap_or(room), &mut parts);
        let paced = budget.is_some() && running.iter().flatten().any(|s| !s.input.is_empty());
        if parts.is_empty() {
            continue;
        }
        // In sequence order: llama.cpp puts consecutive sequences in one pass.
        parts.sort_by_key(|p| p.0);
        let refs: Vec<(usize, &[i32], bool)> = parts.iter().map(|(s, t, l)| (*s, t.as_slice(), *l)).collect();
        let phase = if parts.iter().all(|p| p.1.len() > 1 || running[p.0].as_ref().is_some_and(|s| s.pending.is_none()))
        {
            Phase::Prefill
        } else {
            Phase::Decode
        };
        step += 1;
        let report = match host.session_mut().decode_seqs(&refs, 0, phase, step) {
            Ok(Some(report)) => report,
            failed => {
                // The batch failed (or was stopped): its slots end with the error.
                let error = match failed {
                    Err(e) => host_error(e.into()),
                    _ => ApiError::internal("the engine was stopped"),
                };
                for (seq, _, _) in &parts {
                    if let Some(slot) = running[*seq].take() {
                        host.session_mut().seq_keep_prefix(*seq, &[]);
                        let _ = slot.job.out.send(Out::Done(Err(error.clone())));
                    }
                }
                continue;
            }
        };
        host.record_step(&report);
        pacer.record(StepCost { decoding, prompt, elapsed: std::time::Duration::from_nanos(report.wall_ns) });
        engine.metrics.slots_step(&report, prompt as u32, paced);
        if engine.steps.receiver_count() > 0 {
            let _ = engine.steps.send(step_json(&report));
        }
        for (i, (seq, _, logits)) in parts.iter().enumerate() {
            if !logits {
                continue;
            }
            let logits = host.session_mut().part_logits(&refs, i).to_vec();
            let next = running[*seq].as_mut().map_or(Next::Done, |slot| slot.advance(&model, &logits));
            if matches!(next, Next::Done) {
                finish(&mut host, engine, &mut running, *seq);
            }
        }
        // Clients that went away free their slots.
        for seq in 0..running.len() {
            if running[seq].as_ref().is_some_and(|s| s.job.out.is_closed()) {
                if let Some(slot) = running[seq].as_mut() {
                    slot.generation.aborted = true;
                }
                finish(&mut host, engine, &mut running, seq);
            }
        }
    }
}

/// Adds to `parts` up to `room` tokens of the prompts still to decode,
/// the oldest request's first; returns how many it added.
fn take_prompt_chunks(
    running: &mut [Option<Slot<'_>>],
    mut room: usize,
    parts: &mut Vec<(usize, Vec<i32>, bool)>,
) -> usize {
    let mut waiting: Vec<(u64, usize)> = running
        .iter()
        .enumerate()
        .filter_map(|(seq, s)| s.as_ref().filter(|s| !s.input.is_empty()).map(|s| (s.arrival, seq)))
        .collect();
    waiting.sort_unstable();
    let mut taken = 0;
    for (_, seq) in waiting {
        let Some(slot) = running[seq].as_mut() else { continue };
        if room == 0 {
            break;
        }
        let take = slot.input.len().min(room);
        let chunk: Vec<i32> = slot.input.drain(..take).collect();
        room -= take;
        taken += take;
        slot.generation.summary.prompt_tokens += take as u64;
        parts.push((seq, chunk, slot.input.is_empty()));
    }
    taken
}

/// Starts `job` (the `arrival`th) in the free slot [`place`] picks (beside
/// the running ones, with the longest cached prefix of its prompt copied
/// there), or answers it with the error that prevents it.
fn start<'m>(
    host: &mut Host,
    engine: &Engine,
    model: &'m Model,
    mut job: Job,
    arrival: u64,
    running: &mut [Option<Slot<'m>>],
) {
    let prepared = job.request.prepared.take();
    let settings = &job.request.settings;
    let (begun, called_before) = match &job.request.work {
        Work::Chat(work) => {
            host.show_for_request(work.tools.clone(), work.effort.clone());
            let messages = work.conversation.rendered_messages();
            let called_before = work.conversation.messages.iter().map(|m| m.tool_calls.len()).sum();
            let begun = match prepared {
                Some(prepared) => host.begin_prepared_reply(prepared, &messages, settings, &mut |_| {}),
                None => host.begin_reply(&messages, settings, &mut |_| {}),
            };
            (begun, called_before)
        }
        Work::Complete { prompt: CompletionPrompt::Text(text) } => (host.begin_completion(text, prepared, settings), 0),
        Work::Complete { prompt: CompletionPrompt::Tokens(ids) } => {
            (host.begin_completion_of_tokens(ids, &job.request.settings), 0)
        }
    };
    let reply = match begun {
        Ok(reply) => reply,
        Err(e) => return refuse(job, host_error(e)),
    };
    let sampler = match Sampler::constrained(&reply.sampling, model, reply.constraint.as_ref()) {
        Ok(s) => s,
        Err(e) => return refuse(job, ApiError::bad_request(e)),
    };
    let session = host.session_mut();
    let shared: Vec<usize> = (0..running.len())
        .map(|seq| session.seq_tokens(seq).iter().zip(&reply.tokens).take_while(|(a, b)| a == b).count())
        .collect();
    let held: Vec<usize> = (0..running.len()).map(|seq| session.seq_tokens(seq).len()).collect();
    let busy: Vec<bool> = running.iter().map(Option::is_some).collect();
    let Some(placed) = place(&busy, &shared, &held, session.seqs_swap()) else {
        return refuse(job, ApiError::internal("no free slot"));
    };
    let seq = placed.slot;
    if let Some(from) = placed.bring_from
        && session.seq_swap(from, seq)
        && shared[from] >= MIN_REUSE
    {
        engine.metrics.prefix_copied();
    }
    let kept = session.seq_keep_prefix(seq, &reply.tokens);
    let input = reply.tokens[kept..].to_vec();
    let generation = Generation { reused_tokens: kept, ..Generation::default() };
    running[seq] = Some(Slot {
        job,
        arrival,
        reply,
        sampler,
        input,
        pending: None,
        generation,
        utf8: Utf8Stream::default(),
        called_before,
        logprobs: Vec::new(),
        digests: Vec::new(),
    });
}

/// Moves running slots (their requests, tokens and KV cells) so that they
/// form one block of consecutive sequences, where the session can exchange
/// sequences: the conversation a hole in the block held goes where the
/// moved request was, still cached.
fn gather_slots(host: &mut Host, engine: &Engine, running: &mut [Option<Slot<'_>>]) {
    let session = host.session_mut();
    if !session.seqs_swap() {
        return;
    }
    let busy: Vec<bool> = running.iter().map(Option::is_some).collect();
    for (from, to) in gather(&busy) {
        if session.seq_swap(from, to) {
            running[to] = running[from].take();
            engine.metrics.slot_moved();
        }
    }
}

/// Answers `job` with `error`.
fn refuse(job: Job, error: ApiError) {
    let _ = job.out.send(Out::Done(Err(error)));
}

impl Slot<'_> {
    /// Chooses the next token from `logits` and passes its text on.
    fn advance(&mut self, model: &Model, logits: &[f32]) -> Next {
        if self.job.request.logits_digest {
            self.digests.push(crate::telemetry::digest::logits_digest(logits));
        }
        let Some(token) = self.sampler.sample(logits) else {
            // The grammar is complete and allows no end token.
            self.generation.stopped_at_eog = true;
            return Next::Done;
        };
        if model.is_eog(token) {
            self.generation.stopped_at_eog = true;
            return Next::Done;
        }
        if let Some(top) = self.job.request.logprobs {
            let entry = token_logprob(model, logits, token, top);
            let _ = self.job.out.send(Out::Token(entry.clone()));
            self.logprobs.push(entry);
        }
        self.generation.tokens.push(token);
        self.generation.summary.generated += 1;
        let text = self.utf8.push(&model.token_bytes(token));
        self.generation.text.push_str(&text);
        let out = &self.job.out;
        let stopped = self.reply.push(&text, &mut |event| send(out, event));
        if stopped || self.generation.tokens.len() >= self.reply.n_predict as usize {
            return Next::Done;
        }
        self.pending = Some(token);
        Next::Continue
    }
}

/// Sends a text event to the request's handler.
fn send(out: &tokio::sync::mpsc::UnboundedSender<Out>, event: HostEvent<'_>) {
    if let HostEvent::Text { kind, text } = event
        && !text.is_empty()
    {
        let _ = out.send(Out::Text(kind, text.to_string()));
    }
}

/// Ends the request in slot `seq`: its reply parsed, its answer sent.
fn finish(host: &mut Host, engine: &Engine, running: &mut [Option<Slot<'_>>], seq: usize) {
    let Some(mut slot) = running[seq].take() else { return };
    // The last token (never decoded) is no part of the sequence's tokens.
    let tail = slot.utf8.finish();
    if !tail.is_empty() {
        slot.generation.text.push_str(&tail);
        let out = &slot.job.out;
        slot.reply.push(&tail, &mut |event| send(out, event));
    }
    let out = slot.job.out.clone();
    let turn = host.end_reply(slot.reply, &mut slot.generation, slot.called_before, &mut |event| send(&out, event));
    let raw = matches!(slot.job.request.work, Work::Complete { .. });
    let finished = Finished {
        reasoning: turn.reasoning,
        answer: if raw { turn.generation.text.clone() } else { turn.answer },
        tool_calls: turn.tool_calls,
        finish_reason: finish_reason(turn.ending.reason),
        stop_sequence: turn.stop_sequence,
        prompt_tokens: turn.generation.summary.prompt_tokens + turn.generation.reused_tokens as u64,
        completion_tokens: turn.generation.tokens.len() as u64,
        logprobs: std::mem::take(&mut slot.logprobs),
        logits_digest: std::mem::take(&mut slot.digests),
    };
    // A cancelled request's tokens were decoded all the same.
    if out.is_closed() {
        engine.metrics.cancelled();
    }
    engine.metrics.finished(finished.prompt_tokens, finished.completion_tokens);
    let _ = out.send(Out::Done(Ok(Box::new(finished))));
}
