/* Serves the embedded web UI (see ui.h). The files are immutable for the life of the
 * process; they are sent with no-cache so a rebuilt daemon is picked up at once, and with a
 * Content-Security-Policy that allows nothing but this origin: the page needs no network. */
#include "ui.h"

#include <stdio.h>
#include <string.h>

static const char *type_of(const char *name)
{
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".svg", "image/svg+xml"},
        {".png", "image/png"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(dot, types[i].ext) == 0) return types[i].type;
    return "application/octet-stream";
}

static const cp_ui_asset *find(const char *name)
{
    for (size_t i = 0; i < cp_ui_nassets; i++)
        if (strcmp(cp_ui_assets[i].name, name) == 0) return &cp_ui_assets[i];
    return NULL;
}

int cp_ui_serve(const char *path, cp_http_response *r)
{
    const char *name;
    if (strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0)
        name = "index.html";
    else if (strncmp(path, "/ui/", 4) == 0)
        name = path + 4;
    else
        return 0;
    const cp_ui_asset *a = find(name);
    if (!a) {
        cp_http_error(r, 404, "no UI file '%.128s'", path);
        return 1;
    }
    if (cp_buf_append(&r->body, a->data, a->len)) {
        cp_buf_close(&r->body);
        cp_http_error(r, 503, "out of memory while sending %s", a->name);
        return 1;
    }
    snprintf(r->content_type, sizeof r->content_type, "%s", type_of(a->name));
    snprintf(r->extra_headers, sizeof r->extra_headers,
             "Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n"
             "Content-Security-Policy: default-src 'self'; img-src 'self' data: blob:\r\n");
    return 1;
}
