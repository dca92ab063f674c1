/* The `contprof` command line: a table of subcommands. Offline commands (merge) work on
 * files; the others talk to a contprofd. Also the bash completion script, generated from
 * the same table so it lists what the binary knows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd_run.h" /* the agent launcher */
#include "cmd_v8.h"  /* the V8 source */
#include "import.h"  /* ingest/import.c: the pprof files' producer */

static int cmd_completion(int argc, char **argv);

/* The flags every client command takes (cmd_query.c); completion offers them. */
#define QFLAGS                                                                                     \
    "--server --token --type --select --from --to --format --output --timeout --allow-partial "    \
    "--help"

static const cp_cli_command commands[] = {
    {"merge", cp_cmd_merge, "merge pprof files (raw or gzip) into one: pprof, top or folded"},
    {"query", cp_cmd_query, "the merged profile of a window from contprofd (pprof, json, ...)"},
    {"top", cp_cmd_top, "the table view of a window, like pprof -top"},
    {"series", cp_cmd_series, "series with data in a window"},
    {"labels", cp_cmd_labels, "label names, or the values of one label"},
    {"diff", cp_cmd_diff, "compare two windows or selections, like pprof -top -diff_base"},
    {"timeline", cp_cmd_timeline, "totals per step over a window"},
    {"symbols", cp_cmd_symbols, "upload ELF binaries or debug files: contprofd names their frames"},
    {"capture", cp_cmd_capture, "an on-demand high-resolution capture of named isolates"},
    {"run", cp_cmd_run, "run a program under the profiling agent"},
    {"v8", cp_cmd_v8, "profile every isolate of V8 hosts (workerd, node) through their inspector"},
    {"relay", cp_cmd_relay, "the host's relay: takes processes' windows, holds one Kafka producer"},
    {"import", cp_cmd_import, "send existing pprof files to contprofd through Kafka"},
    {"completion", cmd_completion, "print a shell completion script: completion bash"},
};

/* The flags each subcommand takes, for shell completion (a command missing here still
 * completes by name). */
static const struct {
    const char *name, *flags;
} flag_sets[] = {
    {"merge", "--output --format --sample-index --help"},
    {"query", QFLAGS " --focus --ignore --max-nodes --sample-type"},
    {"top", QFLAGS " --focus --ignore --max-nodes --sample-type"},
    {"series", QFLAGS},
    {"labels", QFLAGS},
    {"diff", QFLAGS " --base-select --base-from --base-to --focus --ignore --max-nodes "
                    "--sample-type"},
    {"timeline", QFLAGS " --step"},
    {"relay", "--dir --server --brokers --token --sign --topic --queue --help"},
    {"run", "--server --relay --brokers --service --version --tenant --label --cpu-hz --alloc-rate "
            "--window --output-dir --topic --no-children --symbolize"},
    {"import", "--server --brokers --tenant --token --service --label --at --duration --no-wait "
               "--timeout --help"},
    {"symbols", "upload --server --token --tenant --help"},
    {"capture", "--select --type --duration --hz --alloc-rate --output --server --token --help"},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: contprof COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f,
            "\n"
            "series, labels, timeline and diff print tables, to a terminal or not; -o json (or\n"
            "--format json) prints the HTTP API's JSON as it comes. Times everywhere: RFC 3339,\n"
            "unix seconds, now, now-15m, -1h; durations: 90s, 15m, 1h30m, 7d (a bare number is\n"
            "seconds).\n"
            "\n"
            "examples:\n"
            "  contprof top --type cpu --select '{service=\"api\"}' --from -1h\n"
            "  contprof timeline --type alloc --select '{service=\"api\"}' --from -6h --step 5m\n"
            "  contprof series --from -15m -o json\n"
            "  contprof diff --type cpu --from -1m --base-from -2m --base-to -1m\n"
            "  contprof query --type inuse --from now-15m -o inuse.pb.gz\n"
            "  source <(contprof completion bash)\n"
            "\n'contprof COMMAND --help' describes one command.\n");
}

/* ---- completion --------------------------------------------------------------------- */

/* The script: subcommands and their flags from the table above, values for the flags that
 * have a fixed set, and label names from the server (`contprof labels`, with the
 * --server/--token of the line being completed) for `labels NAME` and --select. */
static int cmd_completion(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[1], "bash") != 0) {
        FILE *f =
            argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) ? stdout : stderr;
        fprintf(f, "usage: contprof completion bash\n\n"
                   "Prints a bash completion script for contprof: subcommands, flags, and label\n"
                   "names from the server.\n\n"
                   "examples:\n"
                   "  source <(contprof completion bash)                    # this shell\n"
                   "  contprof completion bash > /etc/bash_completion.d/contprof\n");
        return f == stdout ? 0 : 2;
    }
    printf("# bash completion for contprof (generated by `contprof completion bash`)\n"
           "_contprof_labels() {\n"
           "    local a=() i\n"
           "    for ((i = 1; i < ${#COMP_WORDS[@]} - 1; i++)); do\n"
           "        case \"${COMP_WORDS[i]}\" in\n"
           "        --server | --token) a+=(\"${COMP_WORDS[i]}\" \"${COMP_WORDS[i + 1]}\") ;;\n"
           "        esac\n"
           "    done\n"
           "    \"${COMP_WORDS[0]}\" labels \"${a[@]}\" --timeout 2s 2>/dev/null | tail -n +2\n"
           "}\n"
           "_contprof() {\n"
           "    local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD - 1]}\"\n"
           "    local cmds=\"");
    for (size_t i = 0; i < NCOMMANDS; i++)
        printf("%s%s", i ? " " : "", commands[i].name);
    printf(" help\"\n"
           "    if ((COMP_CWORD == 1)); then\n"
           "        COMPREPLY=($(compgen -W \"$cmds --help\" -- \"$cur\"))\n"
           "        return\n"
           "    fi\n"
           "    case \"$prev\" in\n"
           "    --type) COMPREPLY=($(compgen -W \"cpu alloc inuse wall mutex block goroutines "
           "heap\" -- "
           "\"$cur\")); return ;;\n"
           "    --format) COMPREPLY=($(compgen -W \"table json pprof folded top\" -- \"$cur\")); "
           "return ;;\n"
           "    -o | --output) COMPREPLY=($(compgen -W \"json table\" -- \"$cur\") $(compgen -f "
           "-- \"$cur\")); return ;;\n"
           "    --from | --to | --base-from | --base-to | --at)\n"
           "        COMPREPLY=($(compgen -W \"now -5m -15m -1h -6h -24h -7d\" -- \"$cur\")); "
           "return ;;\n"
           "    --step | --duration | --timeout | --window)\n"
           "        COMPREPLY=($(compgen -W \"10s 1m 5m 15m 1h\" -- \"$cur\")); return ;;\n"
           "    --select | --base-select)\n"
           "        COMPREPLY=($(compgen -W \"$(_contprof_labels | sed 's/.*/{&=/')\" -- "
           "\"$cur\")); return ;;\n"
           "    --server | --token | --focus | --ignore | --max-nodes | --sample-type | "
           "--service | --version | --tenant | --label | --brokers | --topic | --cpu-hz | "
           "--alloc-rate | --sample-index) return ;;\n"
           "    esac\n"
           "    local flags=\"\"\n"
           "    case \"${COMP_WORDS[1]}\" in\n");
    for (size_t i = 0; i < sizeof flag_sets / sizeof flag_sets[0]; i++)
        printf("    %s) flags=\"%s\" ;;\n", flag_sets[i].name, flag_sets[i].flags);
    printf("    completion) COMPREPLY=($(compgen -W \"bash\" -- \"$cur\")); return ;;\n"
           "    esac\n"
           "    if [[ $cur == -* ]]; then\n"
           "        COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n"
           "    elif [[ ${COMP_WORDS[1]} == labels ]]; then\n"
           "        COMPREPLY=($(compgen -W \"$(_contprof_labels)\" -- \"$cur\"))\n"
           "    else\n"
           "        COMPREPLY=($(compgen -f -- \"$cur\"))\n"
           "    fi\n"
           "}\n"
           "complete -F _contprof contprof\n");
    return fflush(stdout) ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, argv[1]) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "contprof: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
