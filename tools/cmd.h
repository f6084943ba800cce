/* cmd.h - the tally tool's subcommands, one file each (cmd_run.c, cmd_bench.c, ...), dispatched by
 * tally.c. Each gets its own argv: argv[0] is the subcommand's name ("run"); returns the exit code. */
#ifndef TALLY_TOOLS_CMD_H
#define TALLY_TOOLS_CMD_H

int tally_cmd_run(int argc, char **argv);
int tally_cmd_bench(int argc, char **argv);

/* Weak until their files land, so the tool links while they are being written; tally.c says "not
 * built yet" when one is absent. A cmd_train.c / cmd_plan.c defining them is all it takes. */
int tally_cmd_train(int argc, char **argv) __attribute__((weak));
int tally_cmd_plan(int argc, char **argv) __attribute__((weak));
int tally_cmd_generate(int argc, char **argv) __attribute__((weak));
int tally_cmd_sim(int argc, char **argv);
int tally_cmd_flight(int argc, char **argv);

/* cmd_plan.c's link measurement, which `tally sim --calibrate` shares: starts 2 local ranks of this
 * binary over `transport` and reads back the model rank 0 measured and the time of an allreduce of
 * `bytes`. 0, or -1 after a message on stderr. */
struct tally__cost;
int tally_plan_calibrate_link(const char *transport, double bytes, tally_op op, struct tally__cost *out,
                              double *allreduce_s);

#endif
