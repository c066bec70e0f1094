/*
 * run_model: runs a model through mblob's C API on .npy inputs and writes its outputs as .npy.
 *
 *   run_model MODEL.so|system://PREFIX [--function F] [--device cpu|cuda|opencl[:ID]]
 *             NAME=IN.npy... -o DIR
 *
 * Loads MODEL.so (a TVM `export_library` output: graph, AOT, Relax or Relay VM), or, given
 * `system://PREFIX` (MLC's convention), the model linked into this program under that prefix
 * (a TVM `system-lib` build; this needs the program linked with libmblob.a), and runs it on
 * the device (the CPU by default) with each NAME=IN.npy as input NAME (an argument without
 * `NAME=` sets the next input by position), and writes output K to DIR/out.K.npy.
 * `--function` picks a Relax function.
 *
 * The .npy reader and writer here take float32, float64, int32, int64, int8 and uint8,
 * little-endian, C order: what this example needs, not a general .npy library.
 *
 * Build (after ci/install-capi.sh PREFIX):
 *   cc -std=c99 run_model.c $(pkg-config --cflags --libs mblob) -o run_model
 * With models linked in (their TVM `system-lib` objects, then the static library):
 *   cc -std=c99 run_model.c lib0.o devc.o $(pkg-config --cflags mblob) \
 *      PREFIX/lib/libmblob.a -lpthread -ldl -lm -lrt -o run_model
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mblob.h"

/* A tensor read from or written to a .npy file. */
typedef struct {
    mblob_dtype dtype;
    int32_t ndim;
    int64_t shape[32];
    unsigned char *file; /* the whole file (read) */
    const void *data;
    size_t nbytes;
} npy_tensor;

static const struct {
    const char *descr;
    uint8_t code, bits;
} npy_types[] = {
    {"<f4", 2, 32}, {"<f8", 2, 64}, {"<i4", 0, 32}, {"<i8", 0, 64}, {"|i1", 0, 8}, {"|u1", 1, 8},
};

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "run_model: %s: %s\n", what, detail);
    return 1;
}

/* Fails with mblob's message when `status` is not MBLOB_OK. */
static int check(mblob_status status, const char *what) {
    if (status != MBLOB_OK) {
        fprintf(stderr, "run_model: %s: %s (status %d)\n", what, mblob_last_error(), (int)status);
        return 1;
    }
    return 0;
}

/* Reads `path` into `t`; 0 on success. */
static int npy_read(const char *path, npy_tensor *t) {
    FILE *f = fopen(path, "rb");
    long size;
    size_t header_len, at, i, count = 1;
    const char *header, *p, *end;
    char descr[8] = {0};
    memset(t, 0, sizeof *t);
    if (!f) return fail(path, "cannot open");
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return fail(path, "cannot read");
    }
    t->file = malloc((size_t)size + 1);
    if (!t->file || fread(t->file, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        return fail(path, "cannot read");
    }
    fclose(f);
    t->file[size] = 0;
    if (size < 10 || memcmp(t->file, "\x93NUMPY", 6) != 0) return fail(path, "not a .npy file");
    if (t->file[6] == 1) {
        header_len = (size_t)t->file[8] | (size_t)t->file[9] << 8;
        at = 10;
    } else {
        if (size < 12) return fail(path, "truncated .npy header");
        header_len = (size_t)t->file[8] | (size_t)t->file[9] << 8 | (size_t)t->file[10] << 16 |
                     (size_t)t->file[11] << 24;
        at = 12;
    }
    if (header_len > (size_t)size - at) return fail(path, "truncated .npy header");
    header = (const char *)t->file + at;
    end = header + header_len;
    /* The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } */
    p = strstr(header, "'descr':");
    if (!p || p >= end || !(p = strchr(p + 8, '\'')) || p >= end) return fail(path, "no descr in the .npy header");
    for (i = 0; i + 1 < sizeof descr && p[1 + i] != '\'' && p + 1 + i < end; i++) descr[i] = p[1 + i];
    for (i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
        if (strcmp(descr, npy_types[i].descr) == 0) {
            t->dtype.code = npy_types[i].code;
            t->dtype.bits = npy_types[i].bits;
            t->dtype.lanes = 1;
        }
    }
    if (t->dtype.bits == 0) return fail(path, "dtype not one of <f4 <f8 <i4 <i8 |i1 |u1");
    p = strstr(header, "'fortran_order':");
    if (!p || p >= end || strncmp(p + 16 + strspn(p + 16, " "), "False", 5) != 0)
        return fail(path, "not in C order");
    p = strstr(header, "'shape':");
    if (!p || p >= end || !(p = strchr(p, '(')) || p >= end) return fail(path, "no shape in the .npy header");
    for (p++; *p != ')'; ) {
        char *next;
        long long d = strtoll(p, &next, 10);
        if (next == p || d < 0 || t->ndim == 32) return fail(path, "bad shape in the .npy header");
        t->shape[t->ndim++] = d;
        count *= (size_t)d;
        p = next + strspn(next, ", ");
    }
    t->data = t->file + at + header_len;
    t->nbytes = count * (t->dtype.bits / 8);
    if (t->nbytes != (size_t)size - at - header_len) return fail(path, "data size does not match the shape");
    return 0;
}

/* Writes a tensor to `path` as a version 1.0 .npy file; 0 on success. */
static int npy_write(const char *path, mblob_dtype dtype, int32_t ndim, const int64_t *shape, const void *data,
                     size_t nbytes) {
    char header[1024];
    const char *descr = NULL;
    size_t i, len;
    int32_t k;
    FILE *f;
    for (i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (dtype.code == npy_types[i].code && dtype.bits == npy_types[i].bits && dtype.lanes == 1)
            descr = npy_types[i].descr;
    if (!descr) return fail(path, "output dtype has no .npy spelling here");
    len = (size_t)sprintf(header, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    /* numpy's spelling of the shape: "()", "(10,)", "(2, 10)". */
    for (k = 0; k < ndim && len < 900; k++)
        len += (size_t)sprintf(header + len, "%s%lld", k ? ", " : "", (long long)shape[k]);
    if (ndim == 1) header[len++] = ',';
    len += (size_t)sprintf(header + len, "), }");
    /* Pad with spaces so that magic, version, length and header end on a 64-byte boundary. */
    while ((10 + len + 1) % 64 != 0) header[len++] = ' ';
    header[len++] = '\n';
    f = fopen(path, "wb");
    if (!f) return fail(path, "cannot create");
    if (fwrite("\x93NUMPY\x01\x00", 1, 8, f) != 8 || fputc((int)(len & 0xff), f) == EOF ||
        fputc((int)(len >> 8), f) == EOF || fwrite(header, 1, len, f) != len ||
        (nbytes && fwrite(data, 1, nbytes, f) != nbytes)) {
        fclose(f);
        return fail(path, "cannot write");
    }
    return fclose(f) == 0 ? 0 : fail(path, "cannot write");
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *function = NULL, *out_dir = NULL, *device = "cpu";
    int32_t device_type = 1 /* kDLCPU */, device_id = 0;
    mblob_library *lib = NULL;
    mblob_model *model = NULL;
    size_t positional = 0, n_outputs = 0, k;
    int i, rc = 1;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--function") == 0 && i + 1 < argc) function = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out_dir = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
        else if (!model_path) model_path = argv[i];
    }
    if (!model_path || !out_dir) {
        fprintf(stderr, "usage: run_model MODEL.so|system://PREFIX [--function F] [--device cpu|cuda|opencl[:ID]] NAME=IN.npy... -o DIR\n");
        return 2;
    }
    /* DLPack's device codes: kDLCPU 1, kDLCUDA 2, kDLOpenCL 4. */
    if (strncmp(device, "cuda", 4) == 0) device_type = 2;
    else if (strncmp(device, "opencl", 6) == 0) device_type = 4;
    else if (strncmp(device, "cpu", 3) != 0) return fail(device, "unknown device (cpu, cuda or opencl)");
    if (strchr(device, ':')) device_id = atoi(strchr(device, ':') + 1);
    if (strncmp(model_path, "system://", 9) == 0) {
        if (check(mblob_library_load_system(model_path + 9, &lib), model_path)) goto done;
    } else if (check(mblob_library_load(model_path, &lib), model_path)) {
        goto done;
    }
    if (check(mblob_model_new(lib, device_type, device_id, &model), model_path)) goto done;
    if (function && check(mblob_model_select_function(model, function), function)) goto done;

    for (i = 1; i < argc; i++) {
        npy_tensor t;
        const char *arg = argv[i], *eq, *file;
        char name[256] = {0};
        mblob_status status;
        if (strcmp(arg, "--function") == 0 || strcmp(arg, "-o") == 0 || strcmp(arg, "--device") == 0) {
            i++;
            continue;
        }
        if (arg == model_path) continue;
        eq = strchr(arg, '=');
        file = eq ? eq + 1 : arg;
        if (eq && (size_t)(eq - arg) < sizeof name) memcpy(name, arg, (size_t)(eq - arg));
        if (npy_read(file, &t)) {
            free(t.file);
            goto done;
        }
        status = mblob_model_set_input(model, eq ? name : NULL, positional, t.data, t.nbytes, t.dtype.code,
                                       t.dtype.bits, t.dtype.lanes, t.shape, t.ndim);
        free(t.file);
        if (check(status, arg)) goto done;
        if (!eq) positional++;
    }

    if (check(mblob_model_run(model), "run")) goto done;
    if (check(mblob_model_num_outputs(model, &n_outputs), "outputs")) goto done;
    for (k = 0; k < n_outputs; k++) {
        mblob_tensor *out = NULL;
        mblob_dtype dtype;
        int32_t ndim = 0;
        const int64_t *shape = NULL;
        const void *data = NULL;
        size_t nbytes = 0;
        char path[4096];
        int bad;
        if (check(mblob_model_output(model, k, &out), "output")) goto done;
        bad = check(mblob_tensor_dtype(out, &dtype), "output") || check(mblob_tensor_ndim(out, &ndim), "output") ||
              check(mblob_tensor_shape(out, &shape), "output") || check(mblob_tensor_data(out, &data), "output") ||
              check(mblob_tensor_nbytes(out, &nbytes), "output");
        snprintf(path, sizeof path, "%s/out.%lu.npy", out_dir, (unsigned long)k);
        bad = bad || npy_write(path, dtype, ndim, shape, data, nbytes);
        mblob_tensor_free(out);
        if (bad) goto done;
    }
    rc = 0;
done:
    mblob_model_free(model);
    mblob_library_free(lib);
    return rc;
}
