/* The embedded UI files as contprofd serves them: the page at /, assets at /ui/<file> with
 * their content types and a strict Content-Security-Policy, 404 for unknown UI files, and
 * paths that are not the UI's left to the API. */
#include "test.h"
#include "ui.h"

TEST(page_at_root)
{
    cp_http_response r = {.status = 200};
    CHECK_EQ(cp_ui_serve("/", &r), 1);
    CHECK_EQ(r.status, 200);
    CHECK_STREQ(r.content_type, "text/html; charset=utf-8");
    CHECK_CONTAINS(r.extra_headers, "Content-Security-Policy: default-src 'self'");
    cp_buf_append(&r.body, "", 1);
    CHECK_CONTAINS((char *)r.body.data, "<title>contprof</title>");
    CHECK_CONTAINS((char *)r.body.data, "src=\"ui/app.js\"");
    cp_buf_close(&r.body);
}

TEST(every_asset_is_served_with_its_type)
{
    CHECK(cp_ui_nassets >= 7);
    for (size_t i = 0; i < cp_ui_nassets; i++) {
        char path[128];
        snprintf(path, sizeof path, "/ui/%s", cp_ui_assets[i].name);
        cp_http_response r = {.status = 200};
        CHECK_EQ(cp_ui_serve(path, &r), 1);
        CHECK_EQ(r.status, 200);
        CHECK_EQ(r.body.len, cp_ui_assets[i].len);
        CHECK(memcmp(r.body.data, cp_ui_assets[i].data, r.body.len) == 0);
        const char *ext = strrchr(cp_ui_assets[i].name, '.');
        if (strcmp(ext, ".js") == 0) CHECK_STREQ(r.content_type, "text/javascript; charset=utf-8");
        if (strcmp(ext, ".css") == 0) CHECK_STREQ(r.content_type, "text/css; charset=utf-8");
        cp_buf_close(&r.body);
    }
}

TEST(unknown_ui_files_are_404_and_other_paths_are_not_ours)
{
    const char *missing[] = {"/ui/", "/ui/nope.js", "/ui/../api.c", "/ui/app.js/"};
    for (size_t i = 0; i < sizeof missing / sizeof *missing; i++) {
        cp_http_response r = {.status = 200};
        CHECK_EQ(cp_ui_serve(missing[i], &r), 1);
        CHECK_EQ(r.status, 404);
        cp_buf_append(&r.body, "", 1);
        CHECK_CONTAINS((char *)r.body.data, "no UI file");
        cp_buf_close(&r.body);
    }
    const char *others[] = {"/api/v1/profile", "/healthz", "/uix", "/ui", ""};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        cp_http_response r = {.status = 200};
        CHECK_EQ(cp_ui_serve(others[i], &r), 0);
        CHECK_EQ(r.body.len, 0);
    }
}

TEST_MAIN(T(page_at_root), T(every_asset_is_served_with_its_type),
          T(unknown_ui_files_are_404_and_other_paths_are_not_ours))
