/* Linked with -Wl,--wrap=dlopen,--wrap=dlmopen: any call to the dynamic loader's open from the
 * program (mblob included) lands here and kills the process, so a run that succeeds never
 * opened a library. */
#include <stdio.h>
#include <stdlib.h>

void *__wrap_dlopen(const char *file, int mode) {
    (void)mode;
    fprintf(stderr, "no_dlopen: dlopen(%s) called\n", file ? file : "NULL");
    abort();
}

void *__wrap_dlmopen(long ns, const char *file, int mode) {
    (void)ns;
    (void)mode;
    fprintf(stderr, "no_dlopen: dlmopen(%s) called\n", file ? file : "NULL");
    abort();
}
