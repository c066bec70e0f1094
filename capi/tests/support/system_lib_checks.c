/* Checks of mblob_library_load_system in a program that links TVM system-lib models and
 * libmblob.a (see tests/system_lib.rs): prints what it finds, one fact a line.
 *
 *   system_lib_checks PREFIX... [--embed SHARD OFFSET VOCAB HIDDEN OUT TOKEN,TOKEN,...]
 *                     [--generate WEIGHTS N TOKEN,TOKEN,...]
 *
 * For each PREFIX: "PREFIX functions NAME,NAME,..." (a Relax model's functions) or "PREFIX kind
 * K". With --embed: calls the LLM's (tinyllm_) compiled embedding kernel `take1` with
 * mblob_library_call on the embedding table (VOCAB x HIDDEN float32 at OFFSET in the tensor
 * cache's SHARD) and the tokens, writes the embeddings (raw float32) to OUT and prints
 * "embed N". With --generate: makes a language model (mblob_llm_new) of tinyllm_ with the
 * tensor cache in the directory WEIGHTS, generates N tokens greedily after the tokens and prints
 * "generate T,T,...", then "badid STATUS MESSAGE" for the same prompt with its last id made
 * 256 (one past the vocabulary). Then: "missing STATUS MESSAGE" for a prefix no model has, and, after registering
 * a second address under graph19_'s context symbol, "conflict RC STATUS MESSAGE". */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mblob.h"

extern int TVMBackendRegisterSystemLibSymbol(const char *name, void *ptr);

static int other_slot;

/* A compact host DLTensor over `data`. */
static mblob_dl_tensor host_tensor(void *data, int32_t ndim, int64_t *shape, uint8_t code, uint8_t bits) {
    mblob_dl_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = 1;
    t.ndim = ndim;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

/* Reads comma-separated token ids from `p` into `ids` (at most 256); their number. */
static int64_t parse_ids(const char *p, int32_t *ids) {
    int64_t n = 0;
    while (*p && n < 256) {
        ids[n++] = (int32_t)strtol(p, (char **)&p, 10);
        if (*p == ',') p++;
    }
    return n;
}

/* The --generate check; 0 on success. */
static int generate(char **a) {
    int32_t ids[256], out[256];
    int64_t n = parse_ids(a[2], ids);
    size_t want = (size_t)atol(a[1]), got = 0, k;
    struct mblob_library *lib = NULL;
    struct mblob_llm *llm = NULL;
    mblob_status st;
    if (want > 256 || n < 1) return 1;
    if (mblob_library_load_system("tinyllm_", &lib) != MBLOB_OK || mblob_llm_new(lib, a[0], 1, 0, &llm) != MBLOB_OK ||
        mblob_llm_generate(llm, ids, (size_t)n, want, NULL, out, 256, &got) != MBLOB_OK) {
        printf("generate error %s\n", mblob_last_error());
        return 1;
    }
    printf("generate ");
    for (k = 0; k < got; k++) printf("%s%d", k ? "," : "", (int)out[k]);
    printf("\n");
    ids[n - 1] = 256;
    st = mblob_llm_generate(llm, ids, (size_t)n, want, NULL, out, 256, &got);
    printf("badid %d %s\n", (int)st, mblob_last_error());
    mblob_llm_free(llm);
    mblob_library_free(lib);
    return 0;
}

/* The --embed check; 0 on success. */
static int embed(char **a) {
    const char *shard = a[0], *out = a[4];
    long offset = atol(a[1]);
    int64_t vocab = atol(a[2]), hidden = atol(a[3]), n = 0;
    int64_t wshape[2], ishape[1], oshape[2], ret = 0;
    int32_t ids[256];
    void *weight = NULL, *result = NULL;
    FILE *f;
    struct mblob_library *lib = NULL;
    mblob_dl_tensor w, i, o;
    const mblob_dl_tensor *args[3];
    n = parse_ids(a[5], ids);
    if (posix_memalign(&weight, 64, (size_t)(vocab * hidden * 4)) || posix_memalign(&result, 64, (size_t)(n * hidden * 4)))
        return 1;
    f = fopen(shard, "rb");
    if (!f || fseek(f, offset, SEEK_SET) || fread(weight, 4, (size_t)(vocab * hidden), f) != (size_t)(vocab * hidden))
        return 1;
    fclose(f);
    wshape[0] = vocab, wshape[1] = hidden, ishape[0] = n, oshape[0] = n, oshape[1] = hidden;
    w = host_tensor(weight, 2, wshape, 2, 32);
    i = host_tensor(ids, 1, ishape, 0, 32);
    o = host_tensor(result, 2, oshape, 2, 32);
    args[0] = &w, args[1] = &i, args[2] = &o;
    if (mblob_library_load_system("tinyllm_", &lib) != MBLOB_OK ||
        mblob_library_call(lib, "take1", args, 3, &ret) != MBLOB_OK) {
        printf("embed error %s\n", mblob_last_error());
        return 1;
    }
    f = fopen(out, "wb");
    if (!f || fwrite(result, 4, (size_t)(n * hidden), f) != (size_t)(n * hidden)) return 1;
    fclose(f);
    printf("embed %ld\n", (long)n);
    mblob_library_free(lib);
    free(weight);
    free(result);
    return 0;
}

int main(int argc, char **argv) {
    int i;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--embed") == 0) {
            if (i + 6 >= argc || embed(argv + i + 1)) return 1;
            i += 6;
            continue;
        }
        if (strcmp(argv[i], "--generate") == 0) {
            if (i + 3 >= argc || generate(argv + i + 1)) return 1;
            i += 3;
            continue;
        }
        struct mblob_library *lib = NULL;
        struct mblob_model *model = NULL;
        mblob_kind kind;
        size_t n, k;
        if (mblob_library_load_system(argv[i], &lib) != MBLOB_OK ||
            mblob_model_new(lib, 1, 0, &model) != MBLOB_OK || mblob_model_kind(model, &kind) != MBLOB_OK) {
            printf("%s error %s\n", argv[i], mblob_last_error());
            return 1;
        }
        if (mblob_model_num_functions(model, &n) == MBLOB_OK && n > 0) {
            printf("%s functions ", argv[i]);
            for (k = 0; k < n; k++) {
                const char *name = NULL;
                if (mblob_model_function_name(model, k, &name) != MBLOB_OK) return 1;
                printf("%s%s", k ? "," : "", name);
            }
            printf("\n");
        } else {
            printf("%s kind %d\n", argv[i], (int)kind);
        }
        mblob_model_free(model);
        mblob_library_free(lib);
    }
    {
        struct mblob_library *lib = NULL;
        mblob_status st = mblob_library_load_system("nosuchmodel_", &lib);
        printf("missing %d %s\n", (int)st, mblob_last_error());
    }
    {
        struct mblob_library *lib = NULL;
        int rc = TVMBackendRegisterSystemLibSymbol("graph19___tvm_module_ctx", &other_slot);
        mblob_status st = mblob_library_load_system("graph19_", &lib);
        printf("conflict %d %d %s\n", rc, (int)st, mblob_last_error());
    }
    return 0;
}
