/* svg_chart.c - the CLI's line charts as standalone SVG: axes with round ticks (linear, log-2, log-10),
 * series with a legend, reference lines, "no data" for an empty panel; text XML-escaped, no plotting stack. */
#include "svg_chart.h"

#include <math.h>
#include <string.h>

#include "../../src/core/file.h"

#define MARGIN_LEFT   80
#define MARGIN_RIGHT  230 /* the legend */
#define TITLE_BAND    40
#define PLOT_TOP      30 /* below the panel's title */
#define PLOT_BOTTOM   52 /* tick labels and the x axis title */
#define SPARSE_POINTS 40 /* markers on a series of at most this many points (auto) */
#define LEGEND_CHARS  26

/* Eight colours that stay apart for the colour-blind and in grey. */
static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                      "#9467bd", "#8c564b", "#e377c2", "#17becf"};

tally_svg_series *tally_svg_add(tally_svg_panel *p, const char *name, const double *x, const double *y, size_t n) {
    if (p->nseries >= TALLY_SVG_MAX_SERIES) return NULL;
    tally_svg_series *s = &p->series[p->nseries++];
    *s = (tally_svg_series){.name = name, .x = x, .y = y, .n = n};
    return s;
}

void tally_svg_add_ref(tally_svg_panel *p, const char *label, double y) {
    if (p->nrefs < TALLY_SVG_MAX_REFS && isfinite(y)) p->refs[p->nrefs++] = (tally_svg_ref){label, y};
}

/* ---- text ---- */

/* Length of the valid UTF-8 sequence at s, or 0: a stray byte would make the whole file unreadable XML. */
static size_t utf8_len(const unsigned char *s) {
    size_t n = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 2 && s[0] < 0xc2) return 0; /* overlong */
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return n;
}

/* At most `max` characters of s, escaped for XML text and attributes; "..." when cut. */
static void put_text(FILE *f, const char *s, size_t max) {
    size_t chars = 0;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; chars++) {
        if (chars == max) {
            fputs("...", f);
            return;
        }
        size_t n = utf8_len(p);
        if (*p == '&')
            fputs("&amp;", f);
        else if (*p == '<')
            fputs("&lt;", f);
        else if (*p == '>')
            fputs("&gt;", f);
        else if (*p == '"')
            fputs("&quot;", f);
        else if (*p == '\'')
            fputs("&apos;", f);
        else if (n == 0 || (*p < 0x20 && *p != '\t')) /* XML 1.0 has no control characters */
            fputc('?', f);
        else
            fwrite(p, 1, n, f);
        p += n ? n : 1;
    }
}

void tally_svg_label(double v, tally_svg_units units, char *buf, size_t n) {
    static const char suffix[] = "KMGTPE";
    double a = fabs(v), base = units == TALLY_SVG_BYTES ? 1024 : 1000, from = units == TALLY_SVG_BYTES ? 1024 : 1e4;
    if (a < from || !isfinite(v)) {
        snprintf(buf, n, "%.4g", fabs(v) < 1e-12 ? 0.0 : v);
        return;
    }
    int k = 0;
    while (a >= base * 0.9999999 && k < 6) a /= base, v /= base, k++;
    snprintf(buf, n, "%.3g%c", v, suffix[k - 1]);
}

/* ---- axes ---- */

/* Where an axis maps: [lo, hi] in its own units (log2 or log10 of the value on a log axis). */
typedef struct axis_map {
    const tally_svg_axis *axis;
    double lo, hi, step; /* step: between ticks, in the same units */
    double p0, p1;       /* pixels of lo and hi */
} axis_map;

static int usable(const tally_svg_axis *a, double v) { return isfinite(v) && (a->scale == TALLY_SVG_LINEAR || v > 0); }

static double to_axis(const tally_svg_axis *a, double v) {
    return a->scale == TALLY_SVG_LOG2 ? log2(v) : a->scale == TALLY_SVG_LOG10 ? log10(v) : v;
}

static double from_axis(const tally_svg_axis *a, double t) {
    return a->scale == TALLY_SVG_LOG2 ? exp2(t) : a->scale == TALLY_SVG_LOG10 ? pow(10, t) : t;
}

static double px(const axis_map *m, double v) {
    return m->p0 + (to_axis(m->axis, v) - m->lo) / (m->hi - m->lo) * (m->p1 - m->p0);
}

/* 1, 2, 2.5 or 5 times a power of ten: about `want` steps over span. */
static double nice_step(double span, int want) {
    double raw = span / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * mag;
}

/* From the data's extent [lo, hi] (axis units) to round ends and a tick step. */
static void axis_round(axis_map *m, double lo, double hi) {
    const tally_svg_axis *a = m->axis;
    if (a->scale == TALLY_SVG_LINEAR) {
        if (a->from_zero) lo = lo < 0 ? lo : 0, hi = hi > 0 ? hi : 0;
        if (hi - lo <= fabs(hi) * 1e-9)
            lo -= fabs(lo) > 0 ? fabs(lo) * 0.1 : 1, hi += fabs(hi) > 0 ? fabs(hi) * 0.1 : 1;
        m->step = nice_step(hi - lo, 5);
        m->lo = floor(lo / m->step + 1e-9) * m->step;
        m->hi = ceil(hi / m->step - 1e-9) * m->step;
        return;
    }
    m->lo = floor(lo + 1e-9);
    m->hi = ceil(hi - 1e-9);
    if (m->hi <= m->lo) m->lo -= 1, m->hi += 1;
    m->step = ceil((m->hi - m->lo) / 10); /* whole powers, at most about ten labels */
    m->lo = floor(m->lo / m->step) * m->step;
    m->hi = m->lo + ceil((m->hi - m->lo) / m->step) * m->step;
}

/* The panel's extent in both axes over its usable points (and reference lines); 0 when it has none. */
static int panel_extent(const tally_svg_panel *p, double ext[4]) {
    int any = 0;
    ext[0] = ext[2] = HUGE_VAL;
    ext[1] = ext[3] = -HUGE_VAL;
    for (int s = 0; s < p->nseries; s++)
        for (size_t i = 0; i < p->series[s].n; i++) {
            double x = p->series[s].x[i], y = p->series[s].y[i];
            if (!usable(&p->x, x) || !usable(&p->y, y)) continue;
            double tx = to_axis(&p->x, x), ty = to_axis(&p->y, y);
            ext[0] = fmin(ext[0], tx), ext[1] = fmax(ext[1], tx);
            ext[2] = fmin(ext[2], ty), ext[3] = fmax(ext[3], ty);
            any = 1;
        }
    for (int r = 0; any && r < p->nrefs; r++)
        if (usable(&p->y, p->refs[r].y)) {
            double ty = to_axis(&p->y, p->refs[r].y);
            ext[2] = fmin(ext[2], ty), ext[3] = fmax(ext[3], ty);
        }
    return any;
}

/* ---- drawing ---- */

typedef struct box {
    double x0, y0, x1, y1; /* the plot area, y0 at the top */
} box;

static void draw_ticks(FILE *f, const axis_map *mx, const axis_map *my, const box *b) {
    char lab[32];
    int nx = (int)llround((mx->hi - mx->lo) / mx->step), ny = (int)llround((my->hi - my->lo) / my->step);
    for (int i = 0; i <= nx; i++) {
        double v = from_axis(mx->axis, mx->lo + i * mx->step), x = px(mx, v);
        tally_svg_label(v, mx->axis->units, lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", x, b->y0, x, b->y1);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#333\">%s</text>\n", x, b->y1 + 16, lab);
    }
    for (int i = 0; i <= ny; i++) {
        double v = from_axis(my->axis, my->lo + i * my->step), y = px(my, v);
        tally_svg_label(v, my->axis->units, lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", b->x0, y, b->x1, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#333\">%s</text>\n", b->x0 - 6, y + 4, lab);
    }
}

static void draw_axis_titles(FILE *f, const tally_svg_panel *p, const box *b) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#111\">", (b->x0 + b->x1) / 2, b->y1 + 38);
    put_text(f, p->x.title, 100);
    double cy = (b->y0 + b->y1) / 2;
    fprintf(f,
            "</text>\n<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#111\" "
            "transform=\"rotate(-90 18 %.1f)\">",
            cy, cy);
    put_text(f, p->y.title, 100);
    fputs("</text>\n", f);
}

/* The series' colour and dash pattern: its own, or the next colour, dashed once the palette has been used. */
typedef struct look {
    const char *colour, *dash;
} look;

static look series_look(const tally_svg_series *s, int *next) {
    static const char *const dashes[] = {"", " stroke-dasharray=\"6 4\"", " stroke-dasharray=\"2 3\""};
    int auto_colour = s->colour < 1 || s->colour > 8, k = auto_colour ? (*next)++ : s->colour - 1;
    int dash = s->dash > 0 && s->dash < 3 ? s->dash : auto_colour ? k / 8 % 3 : 0;
    return (look){palette[k % 8], dashes[dash]};
}

static int shows_marks(const tally_svg_panel *p, const tally_svg_series *s) {
    if (s->no_line || s->marks != TALLY_SVG_MARK_AUTO) return s->no_line || s->marks == TALLY_SVG_MARK_ALWAYS;
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) k += usable(&p->x, s->x[i]) && usable(&p->y, s->y[i]);
    return k <= SPARSE_POINTS;
}

/* A line through the usable points, broken where one is left out; then its markers. */
static void draw_series(FILE *f, const tally_svg_panel *p, const tally_svg_series *s, look lk, const axis_map *mx,
                        const axis_map *my) {
    const char *faint = s->faint ? " opacity=\"0.35\"" : "";
    if (!s->no_line) {
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s%s d=\"", lk.colour, s->faint ? "1" : "2",
                lk.dash, faint);
        int pen = 0;
        for (size_t i = 0; i < s->n; i++) {
            if (!usable(&p->x, s->x[i]) || !usable(&p->y, s->y[i])) {
                pen = 0;
                continue;
            }
            fprintf(f, "%c%.1f %.1f ", pen ? 'L' : 'M', px(mx, s->x[i]), px(my, s->y[i]));
            pen = 1;
        }
        fputs("\"/>\n", f);
    }
    if (!shows_marks(p, s)) return;
    fprintf(f, "<g fill=\"%s\"%s>\n", lk.colour, faint);
    for (size_t i = 0; i < s->n; i++)
        if (usable(&p->x, s->x[i]) && usable(&p->y, s->y[i]))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\"/>\n", px(mx, s->x[i]), px(my, s->y[i]),
                    s->faint ? "1.5" : "3");
    fputs("</g>\n", f);
}

static void draw_refs(FILE *f, const tally_svg_panel *p, const axis_map *my, const box *b) {
    for (int r = 0; r < p->nrefs; r++) {
        if (!usable(&p->y, p->refs[r].y)) continue;
        double y = px(my, p->refs[r].y);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\" stroke-width=\"1.5\" "
                "stroke-dasharray=\"2 4\"/>\n",
                b->x0, y, b->x1, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\" fill=\"#333\">", b->x1 - 4,
                y < b->y0 + 14 ? y + 13 : y - 5);
        put_text(f, p->refs[r].label, 80);
        fputs("</text>\n", f);
    }
}

static void draw_legend(FILE *f, const tally_svg_panel *p, const box *b) {
    double x = b->x1 + 16, y = b->y0 + 6;
    int next = 0;
    for (int s = 0; s < p->nseries && y < b->y1; s++, y += 18) {
        const tally_svg_series *se = &p->series[s];
        look lk = series_look(se, &next);
        const char *colour = lk.colour;
        if (!se->no_line)
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                    x, y, x + 22, y, colour, lk.dash);
        if (shows_marks(p, se))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\"%s/>\n", x + 11, y, se->faint ? "2" : "3",
                    colour, se->faint ? " opacity=\"0.5\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#111\">", x + 28, y + 4);
        put_text(f, se->name, LEGEND_CHARS);
        fputs("</text>\n", f);
    }
}

static void draw_panel(FILE *f, const tally_svg_panel *p, const box *b) {
    if (p->title) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\" fill=\"#111\">", b->x0,
                b->y0 - 10);
        put_text(f, p->title, 120);
        fputs("</text>\n", f);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fff\" stroke=\"#999\"/>\n", b->x0,
            b->y0, b->x1 - b->x0, b->y1 - b->y0);
    draw_axis_titles(f, p, b);
    double ext[4];
    if (!panel_extent(p, ext)) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"16\" fill=\"#777\">no data</text>\n",
                (b->x0 + b->x1) / 2, (b->y0 + b->y1) / 2);
        return;
    }
    axis_map mx = {.axis = &p->x, .p0 = b->x0, .p1 = b->x1}, my = {.axis = &p->y, .p0 = b->y1, .p1 = b->y0};
    axis_round(&mx, ext[0], ext[1]);
    axis_round(&my, ext[2], ext[3]);
    draw_ticks(f, &mx, &my, b);
    draw_refs(f, p, &my, b);
    int next = 0;
    look lk[TALLY_SVG_MAX_SERIES];
    for (int s = 0; s < p->nseries; s++) lk[s] = series_look(&p->series[s], &next);
    for (int pass = 0; pass < 2; pass++) /* faint ones first, under the rest */
        for (int s = 0; s < p->nseries; s++)
            if ((p->series[s].faint != 0) == (pass == 0)) draw_series(f, p, &p->series[s], lk[s], &mx, &my);
    draw_legend(f, p, b);
}

void tally_svg_print(FILE *f, const tally_svg_chart *c) {
    int w = c->width > 0 ? c->width : 900, ph = c->panel_height > 0 ? c->panel_height : 380;
    int np = c->npanels > 0 ? c->npanels : 1, h = TITLE_BAND + np * ph + 8;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
            w, h, w, h);
    fputs("<title>", f);
    put_text(f, c->title, 200);
    fprintf(f, "</title>\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", w, h);
    fprintf(f, "<text x=\"%d\" y=\"26\" text-anchor=\"middle\" font-size=\"17\" fill=\"#111\">", w / 2);
    put_text(f, c->title, 200);
    fputs("</text>\n", f);
    static const tally_svg_panel empty = {.x = {.title = ""}, .y = {.title = ""}};
    for (int i = 0; i < np; i++) {
        double top = TITLE_BAND + (double)i * ph;
        box b = {MARGIN_LEFT, top + PLOT_TOP, w - MARGIN_RIGHT, top + ph - PLOT_BOTTOM};
        fprintf(f, "<g>\n");
        draw_panel(f, c->npanels > 0 ? &c->panel[i] : &empty, &b);
        fprintf(f, "</g>\n");
    }
    fputs("</svg>\n", f);
}

int tally_svg_write(const char *path, const tally_svg_chart *c) {
    tally__file_out out; /* no rename over a link, device or FIFO at path: the writer decides by what it is */
    int rc = tally__file_out_open(&out, path);
    if (rc) return rc;
    tally_svg_print(out.f, c);
    return tally__file_out_commit(&out);
}
