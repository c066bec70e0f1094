/* Checks of mblob_library_load_system in a program that links TVM system-lib models and
 * libmblob.a (see tests/system_lib.rs): prints what it finds, one fact a line.
 *
 *   system_lib_checks PREFIX...   for each: "PREFIX functions NAME,NAME,..." (a Relax model's
 *                                  functions) or "PREFIX kind K"
 *   then: "missing STATUS MESSAGE" for a prefix no model has, and, after registering a
 *   second address under graph19_'s context symbol, "conflict RC STATUS MESSAGE". */
#include <stdio.h>
#include <string.h>

#include "mblob.h"

extern int TVMBackendRegisterSystemLibSymbol(const char *name, void *ptr);

static int other_slot;

int main(int argc, char **argv) {
    int i;
    for (i = 1; i < argc; i++) {
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
