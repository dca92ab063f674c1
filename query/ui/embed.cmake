# Embeds the web UI's files into C: included from query/CMakeLists.txt, it defines
# CP_UI_ASSETS_C (the generated source); run with -P, it writes that source. Needs nothing
# but CMake itself (file(READ ... HEX)).
set(CP_UI_FILES index.html style.css util.js timeline.js flame.js table.js views.js groups.js lines.js app.js)

if(CMAKE_SCRIPT_MODE_FILE)
  # cmake -DUI_DIR=... -DOUT=... -P embed.cmake
  set(src "/* Generated from query/ui/ by query/ui/embed.cmake; do not edit. */\n")
  string(APPEND src "#include \"ui.h\"\n\n")
  set(table "")
  set(i 0)
  foreach(f ${CP_UI_FILES})
    file(READ ${UI_DIR}/${f} hex HEX)
    string(LENGTH "${hex}" n)
    math(EXPR n "${n} / 2")
    string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
    string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" hex "${hex}")
    string(APPEND src "static const unsigned char a${i}[] = {\n${hex}0};\n")
    string(APPEND table "    {\"${f}\", a${i}, ${n}},\n")
    math(EXPR i "${i} + 1")
  endforeach()
  string(APPEND src "\nconst cp_ui_asset cp_ui_assets[] = {\n${table}};\n")
  string(APPEND src "const size_t cp_ui_nassets = ${i};\n")
  file(WRITE ${OUT}.tmp "${src}")
  file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
  file(REMOVE ${OUT}.tmp)
  return()
endif()

set(CP_UI_ASSETS_C ${CMAKE_CURRENT_BINARY_DIR}/ui_assets.c)
list(TRANSFORM CP_UI_FILES PREPEND ${CMAKE_CURRENT_SOURCE_DIR}/ui/ OUTPUT_VARIABLE _cp_ui_deps)
add_custom_command(OUTPUT ${CP_UI_ASSETS_C}
  COMMAND ${CMAKE_COMMAND} -DUI_DIR=${CMAKE_CURRENT_SOURCE_DIR}/ui -DOUT=${CP_UI_ASSETS_C}
          -P ${CMAKE_CURRENT_SOURCE_DIR}/ui/embed.cmake
  DEPENDS ${_cp_ui_deps} ${CMAKE_CURRENT_SOURCE_DIR}/ui/embed.cmake
  COMMENT "Embedding the web UI")
