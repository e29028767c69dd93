// The reference for resident decode speed: plain llama.cpp (the source bmoe
// links), built for the host CPU, decoding greedily from a prompt the way
// `bmoe generate` does (one prompt batch, then one token per decode), with
// llama.cpp's defaults (mmap, weight repacking on). Prints the decode and
// prefill speeds in bmoe's format, and the CPU features llama.cpp uses.
//
// usage: decode MODEL PROMPT N_PREDICT THREADS [norepack]
//   norepack: weights stay in the file's layout (as bmoe's `--repack off`).
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void quiet(enum ggml_log_level level, const char * text, void * data) {
    (void) data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "norepack") == 0)) {
        fprintf(stderr, "usage: %s MODEL PROMPT N_PREDICT THREADS [norepack]\n", argv[0]);
        return 2;
    }
    const char * path = argv[1];
    const char * prompt = argv[2];
    int n_predict = atoi(argv[3]);
    int threads = atoi(argv[4]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = argc != 6;
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 4096;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token tokens[512];
    int n_prompt = llama_tokenize(vocab, prompt, (int) strlen(prompt), tokens, 512, true, true);
    if (n_prompt <= 0) {
        fprintf(stderr, "cannot tokenize the prompt\n");
        return 1;
    }
    double t0 = now();
    if (llama_decode(ctx, llama_batch_get_one(tokens, n_prompt))) {
        fprintf(stderr, "prompt decode failed\n");
        return 1;
    }
    double t1 = now();
    int decoded = 0;
    for (int i = 0; i < n_predict; i++) {
        const float * logits = llama_get_logits_ith(ctx, -1);
        llama_token best = 0;
        for (llama_token t = 1; t < n_vocab; t++) {
            if (logits[t] > logits[best]) {
                best = t;
            }
        }
        if (llama_vocab_is_eog(vocab, best) || i + 1 == n_predict) {
            break;
        }
        if (llama_decode(ctx, llama_batch_get_one(&best, 1))) {
            fprintf(stderr, "decode failed\n");
            return 1;
        }
        decoded++;
    }
    double t2 = now();
    printf("decode:  %d tokens in %.2f s (%.2f tok/s) | prefill: %d tokens (%.1f tok/s)\n", decoded, t2 - t1,
           decoded / (t2 - t1), n_prompt, n_prompt / (t1 - t0));
    printf("cpu:     %s\n", llama_print_system_info());
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
