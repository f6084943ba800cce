#!/usr/bin/env python3
# svg_check.py - tests/cli/test_charts.c's reader of an SVG file as a browser would take it: well-formed XML whose
# root is <svg> in the SVG namespace with width, height and viewBox, and each expected text among its words.
# usage: svg_check.py FILE [TEXT ...]      exit 0, or 1 after saying what is wrong.
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def main(path, wanted):
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        return f"{path}: not well-formed XML: {e}"
    if root.tag != SVG + "svg":
        return f"{path}: the root is {root.tag}, not {SVG}svg"
    for attr in ("width", "height", "viewBox"):
        if not root.get(attr):
            return f"{path}: the root has no {attr}"
    texts = [t for el in root.iter() if el.tag in (SVG + "text", SVG + "title") for t in el.itertext()]
    for want in wanted:
        if not any(want in t for t in texts):
            return f"{path}: no text '{want}' (texts: {texts[:40]})"
    return None


if __name__ == "__main__":
    why = main(sys.argv[1], sys.argv[2:])
    print(why or "ok")
    sys.exit(1 if why else 0)
