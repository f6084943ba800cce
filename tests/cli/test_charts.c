/* test_charts.c - the SVG charts the CLI writes (train --plot, bench/plan/sim --svg): the writer on its own
 * (escaping, ticks, NaN left out, "no data"), each command's file as XML with its titles and series, and each
 * rendered by headless Chromium: not blank, its labels in the page. Skips (77) the rendering without chromium. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tally.h>
#include <zlib.h>

#include "../../tools/charts/svg_chart.h"
#include "harness.h"
#include "tool_runner.h"

#define CHROMIUM_S    60 /* one chromium run, bounded */
#define PYTHON_S      20
#define INK_PIXELS    3000 /* a chart's lines and text: far more pixels than this are not the background */
#define SHELL_OUT_CAP (1 << 18)

static char g_dir[] = "/tmp/tally-test-charts-XXXXXX";
static char g_out[SHELL_OUT_CAP];

/* ---- the writer on its own ---- */

static char *chart_text(const tally_svg_chart *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    tally_svg_print(f, c);
    fclose(f);
    return buf;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* python3 reads it as a browser would: XML, the <svg> root in its namespace, the texts given. */
static int svg_ok(const char *path, const char *const *texts) {
    char cmd[1100];
    size_t o =
        (size_t)snprintf(cmd, sizeof cmd, "python3 %s/tests/cli/svg_check.py '%s'", getenv("TALLY_SOURCE_DIR"), path);
    for (int i = 0; texts && texts[i] && o < sizeof cmd; i++)
        o += (size_t)snprintf(cmd + o, sizeof cmd - o, " '%s'", texts[i]);
    int rc = th_shell(cmd, PYTHON_S, g_out, sizeof g_out);
    if (rc) fprintf(stderr, "svg_check %s: exit %d: %s\n", path, rc, g_out);
    return rc == 0;
}

static const char *write_text(const char *name, const char *text) {
    const char *path = th_path(g_dir, name);
    th_write_file(path, text, strlen(text));
    return path;
}

static void test_labels(void) {
    static const struct {
        double v;
        tally_svg_units u;
        const char *want;
    } cases[] = {{1024, TALLY_SVG_BYTES, "1K"},    {1536, TALLY_SVG_BYTES, "1.5K"},  {1 << 20, TALLY_SVG_BYTES, "1M"},
                 {512, TALLY_SVG_BYTES, "512"},    {12000, TALLY_SVG_NUMBER, "12K"}, {2.5e6, TALLY_SVG_NUMBER, "2.5M"},
                 {0.25, TALLY_SVG_NUMBER, "0.25"}, {1e-17, TALLY_SVG_NUMBER, "0"},   {1000, TALLY_SVG_NUMBER, "1000"}};
    char buf[32];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tally_svg_label(cases[i].v, cases[i].u, buf, sizeof buf);
        TH_CHECK(!strcmp(buf, cases[i].want), "label of %g: '%s', want '%s'", cases[i].v, buf, cases[i].want);
    }
}

/* Quotes, ampersands and angle brackets in every text; a stray byte that is not UTF-8 made '?'. */
static void test_escaping(void) {
    static const double x[] = {1, 2}, y[] = {1, 2};
    tally_svg_chart c = {.title = "A & B <c> \"d\" 'e'", .npanels = 1};
    tally_svg_panel *p = &c.panel[0];
    p->title = "p<1>";
    p->x = (tally_svg_axis){.title = "x & y"};
    p->y = (tally_svg_axis){.title = "<y>"};
    tally_svg_add(p, "ring & \"tree\"\xff", x, y, 2);
    tally_svg_add_ref(p, "ceiling <1/(1-P)>", 3);
    char *s = chart_text(&c);
    TH_CHECK(s && strstr(s, "A &amp; B &lt;c&gt; &quot;d&quot; &apos;e&apos;") && strstr(s, "x &amp; y") &&
                 strstr(s, "&lt;y&gt;") && strstr(s, "ring &amp; &quot;tree&quot;?") &&
                 strstr(s, "ceiling &lt;1/(1-P)&gt;") && !strstr(s, "<c>") && !strstr(s, "\xff"),
             "escaping:\n%.3000s", s ? s : "(none)");
    TH_CHECK(s && svg_ok(write_text("escape.svg", s), (const char *const[]){"A & B <c>", "ring & \"tree\"", NULL}),
             "the escaped chart is not read back");
    free(s);
}

/* Log axes tick at round powers: 1K, 2K, ... on log 2 bytes; 10, 100, 1000, 10K on log 10. */
static void test_log_ticks(void) {
    static const double x[] = {1024, 4096, 65536}, y[] = {12, 900, 20000};
    tally_svg_chart c = {.title = "log", .npanels = 1};
    tally_svg_panel *p = &c.panel[0];
    p->x = (tally_svg_axis){.title = "size", .scale = TALLY_SVG_LOG2, .units = TALLY_SVG_BYTES};
    p->y = (tally_svg_axis){.title = "time", .scale = TALLY_SVG_LOG10};
    tally_svg_add(p, "s", x, y, 3);
    char *s = chart_text(&c);
    static const char *const want[] = {">1K<", ">2K<",  ">4K<",   ">8K<",  ">64K<",
                                       ">10<", ">100<", ">1000<", ">10K<", ">100K<"};
    for (size_t i = 0; s && i < sizeof want / sizeof *want; i++)
        TH_CHECK(strstr(s, want[i]), "no tick %s in:\n%.3000s", want[i], s);
    TH_CHECK(s && !strstr(s, ">3K<") && !strstr(s, ">128K<"), "ticks past the data or not round:\n%.3000s", s ? s : "");
    free(s);
}

/* NaN and Inf are left out (the line breaks there); nothing not finite reaches the file. */
static void test_not_finite(void) {
    static const double x[] = {1, 2, 3, 4, 5}, y[] = {1, NAN, INFINITY, 4, 5};
    tally_svg_chart c = {.title = "holes", .npanels = 1};
    tally_svg_panel *p = &c.panel[0];
    p->x = (tally_svg_axis){.title = "x"};
    p->y = (tally_svg_axis){.title = "y"};
    tally_svg_add(p, "holes", x, y, 5)->marks = TALLY_SVG_MARK_ALWAYS;
    tally_svg_add_ref(p, "nan ref", NAN);
    char *s = chart_text(&c);
    TH_CHECK(s && count(s, "<circle") == 3 + 1 && count(s, " d=\"M") == 1 && count(s, "M") >= 2,
             "3 points (and the legend's marker), the line broken once:\n%.3000s", s ? s : "");
    TH_CHECK(s && !strstr(s, "nan") && !strstr(s, "inf") && !strstr(s, "nan ref"), "a value not finite got in");
    free(s);
}

/* An empty series, or a chart without panels, is still a chart: it says "no data". */
static void test_empty(void) {
    static const double v[] = {NAN};
    tally_svg_chart c = {.title = "empty", .npanels = 2};
    c.panel[0].x = c.panel[0].y = c.panel[1].x = c.panel[1].y = (tally_svg_axis){.title = "t"};
    tally_svg_add(&c.panel[0], "none", v, v, 0);
    tally_svg_add(&c.panel[1], "nan", v, v, 1);
    char *s = chart_text(&c);
    TH_CHECK(s && count(s, ">no data<") == 2, "two panels without data:\n%.3000s", s ? s : "");
    TH_CHECK(s && svg_ok(write_text("empty.svg", s), (const char *const[]){"no data", NULL}), "empty chart");
    free(s);
    tally_svg_chart none = {.title = "nothing"};
    s = chart_text(&none);
    TH_CHECK(s && count(s, ">no data<") == 1 && svg_ok(write_text("none.svg", s), NULL), "no panels:\n%.2000s",
             s ? s : "");
    free(s);
}

static void test_write_error(void) {
    tally_svg_chart c = {.title = "x"};
    int rc = tally_svg_write("/nonexistent-tally-dir/chart.svg", &c);
    TH_CHECK(rc != 0 && strstr(tally_last_error(), "/nonexistent-tally-dir"), "rc %d: %s", rc, tally_last_error());
}

/* ---- the commands ---- */

typedef struct chart_case {
    const char *name;      /* the file under g_dir */
    const char *args[40];  /* tally's arguments; "@" is replaced by the file */
    const char *texts[12]; /* titles and series the chart must have */
    int width, height;     /* of the page chromium renders */
} chart_case;

static const chart_case cases[] = {
    {"train.svg",
     {"train", "-n", "2", "--data", "synthetic:2048", "--epochs", "2", "--batch", "16", "--hidden", "32", "--quiet",
      "--plot", "@"},
     {"loss against steps", "step", "loss", "train loss", "test loss", "samples/s", "tally train: mlp"},
     900,
     730},
    {"bench.svg",
     {"bench", "allreduce", "-n", "2", "-b", "1K", "-e", "64K", "-f", "4", "--iters", "5", "--algo", "ring,rhd",
      "--svg", "@"},
     {"message size (bytes)", "busbw (GB/s)", "ring / shm", "rhd / shm", "1K", "64K"},
     900,
     430},
    {"plan.svg",
     {"plan", "--params", "100M", "--workers", "64", "--svg", "@"},
     {"ranks (n)", "speed-up over one rank", "ideal S(n) = n", "Amdahl S(n)", "Amdahl ceiling 1/(1-P)", "64"},
     900,
     470},
    {"sim.svg",
     {"sim", "--hosts", "2", "--ranks-per-host", "2", "--size", "1K,64K,1M", "--algo", "ring", "--svg", "@"},
     {"message size (bytes)", "busbw (GB/s)", "time (us)", "ring"},
     900,
     730},
    {"sim_train.svg",
     {"sim", "--train", "--params", "10M", "--compute", "50ms", "--hosts", "8", "--ranks-per-host", "2", "--svg", "@"},
     {"hosts (2 ranks each)", "speed-up", "simulated speed-up", "step", "time (ms)"},
     900,
     730},
};
#define NCASES (sizeof cases / sizeof *cases)

static void run_case(const chart_case *c, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", g_dir, c->name);
    const char *args[41];
    int n = 0;
    for (; c->args[n]; n++) args[n] = strcmp(c->args[n], "@") ? c->args[n] : path;
    args[n] = NULL;
    static th_tool r;
    th_tool_opts o = {.wall_s = 60};
    double t0 = th_now();
    th_tool_run(args, &o, &r);
    TH_CHECK(r.rc == 0 && !r.timed_out, "tally %s ... %s: exit %d:\n%.3000s", c->args[0], c->name, r.rc, r.out);
    TH_CHECK(svg_ok(path, c->texts), "%s: not the chart expected", c->name);
    printf("  %-14s written and read back (%.1f s)\n", c->name, th_now() - t0);
}

/* A file that cannot be created: exit non-zero, the message names it. */
static void test_cli_errors(void) {
    static const char *const bad = "/nonexistent-tally-dir/x.svg";
    const char *plan[] = {"plan", "--params", "1M", "--workers", "4", "--svg", bad, NULL};
    const char *sim[] = {"sim", "--size", "1K", "--svg", bad, NULL};
    const char *bench[] = {"bench", "allreduce", "-n", "1", "-b", "8", "-e", "8", "--iters", "1", "--svg", bad, NULL};
    const char *train[] = {"train", "--data", "synthetic:256", "--steps", "2", "--quiet", "--plot", bad, NULL};
    const char *const *runs[] = {plan, sim, bench, train};
    static th_tool r;
    for (size_t i = 0; i < 4; i++) {
        th_tool_opts o = {.wall_s = 30};
        th_tool_run(runs[i], &o, &r);
        TH_CHECK(r.rc != 0 && strstr(r.out, bad), "tally %s with %s: exit %d:\n%.2000s", runs[i][0], bad, r.rc, r.out);
    }
}

/* ---- rendering ---- */

/* The PNG's pixels (8-bit RGB or RGBA, not interlaced) that are not white: what a chart draws. -1 when it
 * cannot be read. Chromium writes exactly this kind. */
static long png_ink(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static unsigned char file[1 << 23];
    size_t len = fread(file, 1, sizeof file, f);
    fclose(f);
    if (len < 33 || memcmp(file, "\x89PNG\r\n\x1a\n", 8)) return -1;
    unsigned w = 0, h = 0, depth = 0, type = 0, interlace = 1, bpp;
    unsigned char *idat = malloc(len);
    size_t nidat = 0;
    for (size_t at = 8; idat && at + 12 <= len;) {
        size_t n = (size_t)file[at] << 24 | file[at + 1] << 16 | file[at + 2] << 8 | file[at + 3];
        const unsigned char *type_at = file + at + 4, *d = file + at + 8;
        if (at + 12 + n > len) break;
        if (!memcmp(type_at, "IHDR", 4)) {
            w = (unsigned)d[0] << 24 | d[1] << 16 | d[2] << 8 | d[3];
            h = (unsigned)d[4] << 24 | d[5] << 16 | d[6] << 8 | d[7];
            depth = d[8], type = d[9], interlace = d[12];
        } else if (!memcmp(type_at, "IDAT", 4)) {
            memcpy(idat + nidat, d, n);
            nidat += n;
        }
        at += 12 + n;
    }
    bpp = type == 6 ? 4 : 3;
    long ink = -1;
    uLongf raw_len = (uLongf)h * (1 + (uLongf)w * bpp);
    unsigned char *raw = depth == 8 && (type == 2 || type == 6) && !interlace && w && h ? malloc(raw_len) : NULL;
    if (raw && uncompress(raw, &raw_len, idat, nidat) == Z_OK && raw_len == (uLongf)h * (1 + (uLongf)w * bpp)) {
        size_t stride = (size_t)w * bpp;
        ink = 0;
        for (unsigned y = 0; y < h; y++) {
            unsigned char *row = raw + (size_t)y * (stride + 1) + 1, *up = y ? row - stride - 1 : NULL;
            for (size_t i = 0; i < stride; i++) { /* undo the row's filter, byte by byte */
                int a = i >= bpp ? row[i - bpp] : 0, b = up ? up[i] : 0, c = up && i >= bpp ? up[i - bpp] : 0;
                int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
                int pred[5] = {0, a, b, (a + b) / 2, pa <= pb && pa <= pc ? a : pb <= pc ? b : c};
                row[i] = (unsigned char)(row[i] + pred[row[-1] < 5 ? row[-1] : 0]);
            }
            for (unsigned x = 0; x < w; x++) {
                const unsigned char *px = row + (size_t)x * bpp;
                ink += px[0] < 235 || px[1] < 235 || px[2] < 235;
            }
        }
    }
    free(raw);
    free(idat);
    return ink;
}

/* chromium with its profile and crash dumps in a directory of ours, removed after. */
static int chromium(const char *what, const char *page, int w, int h, const char *png) {
    char cmd[1100], prof[80];
    snprintf(prof, sizeof prof, "%s/chromium", g_dir);
    snprintf(cmd, sizeof cmd,
             "chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run "
             "--user-data-dir=%s/profile --crash-dumps-dir=%s/crash %.40s%.200s --window-size=%d,%d 'file://%.200s'",
             prof, prof, what, png ? png : "", w, h, page);
    int rc = th_shell(cmd, CHROMIUM_S, g_out, sizeof g_out);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", prof);
    char junk[256];
    th_shell(cmd, 30, junk, sizeof junk);
    return rc;
}

static void render(const chart_case *c, const char *path) {
    char png[160];
    snprintf(png, sizeof png, "%s/%s.png", g_dir, c->name);
    double t0 = th_now();
    int rc = chromium("--screenshot=", path, c->width, c->height, png);
    long ink = png_ink(png);
    TH_CHECK(rc == 0 && ink > INK_PIXELS, "%s rendered: chromium exit %d, %ld pixels not white (want > %d):\n%.2000s",
             c->name, rc, ink, INK_PIXELS, g_out);
    rc = chromium("--dump-dom", path, c->width, c->height, NULL);
    TH_CHECK(rc == 0 && strstr(g_out, "<svg"), "%s: chromium --dump-dom exit %d:\n%.2000s", c->name, rc, g_out);
    for (int i = 0; rc == 0 && c->texts[i]; i++)
        TH_CHECK(strstr(g_out, c->texts[i]), "%s: '%s' not in chromium's page", c->name, c->texts[i]);
    printf("  %-14s rendered: %ld pixels drawn (%.1f s)\n", c->name, ink, th_now() - t0);
}

int main(void) {
    if (!mkdtemp(g_dir)) return perror("mkdtemp"), 2;
    if (th_quick()) { /* the writer and the CLI's files, read back without a browser */
        test_labels();
        test_escaping();
        test_log_ticks();
        test_not_finite();
        test_empty();
        test_write_error();
    }
    char paths[NCASES][128];
    for (size_t i = 0; i < NCASES; i++) run_case(&cases[i], paths[i], sizeof paths[i]); /* external renders them */
    if (th_quick()) test_cli_errors();
    int have = 0;
    if (th_external()) { /* the external tier: each file rendered in headless chromium */
        have = th_shell("sh -c 'command -v chromium'", 10, g_out, sizeof g_out) == 0;
        for (size_t i = 0; have && i < NCASES; i++) render(&cases[i], paths[i]);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    th_shell(cmd, 30, g_out, sizeof g_out);
    if (th_external() && !have && !th_failed) {
        printf("test_charts: SKIP the rendering: chromium is not installed (scripts/deps.sh --tests installs it); "
               "%d checks passed\n",
               th_passed);
        return 77;
    }
    return th_verdict("test_charts");
}
