/* svg_chart.h - line charts as standalone SVG, written by the CLI itself (train --plot, bench/plan/sim --svg):
 * panels stacked in one file, each with its axes (linear, log-2, log-10), series, legend and reference lines. */
#ifndef TALLY_TOOLS_SVG_CHART_H
#define TALLY_TOOLS_SVG_CHART_H

#include <stddef.h>
#include <stdio.h>

#define TALLY_SVG_MAX_SERIES 16
#define TALLY_SVG_MAX_REFS   4
#define TALLY_SVG_MAX_PANELS 3

typedef enum { TALLY_SVG_LINEAR, TALLY_SVG_LOG2, TALLY_SVG_LOG10 } tally_svg_scale;
typedef enum { TALLY_SVG_NUMBER, TALLY_SVG_BYTES } tally_svg_units; /* tick labels: 12K (1000s), or 4K (1024s) */

typedef struct tally_svg_axis {
    const char *title;
    tally_svg_scale scale;
    tally_svg_units units;
    int from_zero; /* linear: the range reaches down (or up) to 0 */
} tally_svg_axis;

/* Markers: drawn when the series has few points (auto), always, or never. */
typedef enum { TALLY_SVG_MARK_AUTO, TALLY_SVG_MARK_ALWAYS, TALLY_SVG_MARK_NEVER } tally_svg_marks;

/* A series points at the caller's arrays (x[i], y[i]); points that are not finite (or not > 0 on a log axis)
 * are left out and break the line there. */
typedef struct tally_svg_series {
    const char *name;
    const double *x, *y;
    size_t n;
    tally_svg_marks marks;
    int no_line; /* markers only (the raw points under a smoothed line) */
    int faint;   /* drawn light and small, behind the rest */
    int dash;    /* 0 solid, 1 dashed, 2 dotted; a ninth series on (colour 0) is dashed by itself */
    int colour;  /* 1..8: that colour of the palette (two series that belong together); 0: the next one */
} tally_svg_series;

/* A horizontal line across the panel at y, with its label (an ideal, a ceiling). */
typedef struct tally_svg_ref {
    const char *label;
    double y;
} tally_svg_ref;

typedef struct tally_svg_panel {
    const char *title; /* NULL: none */
    tally_svg_axis x, y;
    tally_svg_series series[TALLY_SVG_MAX_SERIES];
    int nseries;
    tally_svg_ref refs[TALLY_SVG_MAX_REFS];
    int nrefs;
} tally_svg_panel;

typedef struct tally_svg_chart {
    const char *title;
    tally_svg_panel panel[TALLY_SVG_MAX_PANELS];
    int npanels;
    int width, panel_height; /* pixels; 0: 900 and 380 */
} tally_svg_chart;

/* Adds a series to p (ignored past TALLY_SVG_MAX_SERIES); returns it for its style fields, or NULL. */
tally_svg_series *tally_svg_add(tally_svg_panel *p, const char *name, const double *x, const double *y, size_t n);
/* Adds a reference line to p (ignored past TALLY_SVG_MAX_REFS, or when y is not finite). */
void tally_svg_add_ref(tally_svg_panel *p, const char *label, double y);

/* The chart as SVG on f. A panel without a finite point still has its frame and says "no data". */
void tally_svg_print(FILE *f, const tally_svg_chart *c);
/* The chart into the file `path`, written as every output is (tally__file_out_open: a file replaced whole,
 * a device, FIFO or descriptor in place, a link never replaced). 0, or a TALLY_E_* code with
 * tally_last_error() naming the file. */
int tally_svg_write(const char *path, const tally_svg_chart *c);

/* A tick label: 1K, 1.5M (units BYTES: powers of 1024), 12K, 0.25, 3 (NUMBER). For tests and titles. */
void tally_svg_label(double v, tally_svg_units units, char *buf, size_t n);

#endif
