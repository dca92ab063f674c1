/* Messages for the shared error codes and the helper that fills a cp_err. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

const char *cp_strerror(int code)
{
    switch (code) {
    case 0:
        return "ok";
#define CP_ERR_MSG_(name, msg)                                                                     \
    case CP_E##name:                                                                               \
        return msg;
        CP_ERRNO_MAP(CP_ERR_MSG_)
#undef CP_ERR_MSG_
    }
    return "unknown error";
}

const char *cp_errname(int code)
{
    switch (code) {
    case 0:
        return "OK";
#define CP_ERR_NAME_(name, msg)                                                                    \
    case CP_E##name:                                                                               \
        return #name;
        CP_ERRNO_MAP(CP_ERR_NAME_)
#undef CP_ERR_NAME_
    }
    return "UNKNOWN";
}

int cp_err_set(cp_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}
