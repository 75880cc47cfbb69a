/* freopen(NULL, "w", stream) truncates the stream's own file, which the call never names:
 * the shim must find the name through the stream's descriptor and keep the old bytes. */
#include <stdio.h>

int main(void) {
    FILE *f = fopen("existing", "r");
    if (!f) { perror("fopen"); return 2; }
    f = freopen(NULL, "w", f);
    if (!f) { perror("freopen"); return 3; }
    fputs("replaced\n", f);
    fclose(f);
    printf("ok\n");
    return 0;
}
