#!/usr/bin/env python3
"""Make the vendored modern-go/reflect2 v1.0.1 safe on Go >= 1.18.

Since Go 1.18 reflect.mapiterinit fills a caller-provided iterator
(`func mapiterinit(t *rtype, m unsafe.Pointer, it *hiter)`). reflect2 v1.0.1
still declares the old signature and a two-field hiter, so the runtime writes
past the allocation and kube-apiserver / kubelet crash in map iteration.
This rewrites the declaration to the out-parameter form and gives hiter the
runtime's full layout (as reflect2 v1.0.2 does). Idempotent.
"""
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
link = root / "unsafe_link.go"
umap = root / "unsafe_map.go"
src_link = link.read_text()
src_map = umap.read_text()

if "it *hiter)\n" in src_link and "var it hiter" in src_map:
    print("patch-reflect2: already patched")
    sys.exit(0)

old_decl = "func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer) *hiter\n"
new_decl = "func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer, it *hiter)\n"
old_hiter = """type hiter struct {
	key   unsafe.Pointer // Must be in first position.  Write nil to indicate iteration end (see cmd/internal/gc/range.go).
	value unsafe.Pointer // Must be in second position (see cmd/internal/gc/range.go).
	// rest fields are ignored
}"""
# Mirrors runtime.hiter (runtime/map.go) of Go 1.18-1.21.
new_hiter = """type hiter struct {
	key         unsafe.Pointer
	value       unsafe.Pointer
	t           unsafe.Pointer
	h           unsafe.Pointer
	buckets     unsafe.Pointer
	bptr        unsafe.Pointer
	overflow    *[]unsafe.Pointer
	oldoverflow *[]unsafe.Pointer
	startBucket uintptr
	offset      uint8
	wrapped     bool
	B           uint8
	i           uint8
	bucket      uintptr
	checkBucket uintptr
}"""
old_iter = """	return &UnsafeMapIterator{
		hiter:      mapiterinit(type2.rtype, *(*unsafe.Pointer)(obj)),"""
new_iter = """	var it hiter
	mapiterinit(type2.rtype, *(*unsafe.Pointer)(obj), &it)
	return &UnsafeMapIterator{
		hiter:      &it,"""

for old, text, name in ((old_decl, src_link, "mapiterinit declaration"),
                        (old_hiter, src_link, "hiter struct"),
                        (old_iter, src_map, "UnsafeIterate")):
    if old not in text:
        sys.exit(f"patch-reflect2: {name} not found in {root}; unexpected reflect2 version")

src_link = src_link.replace(old_decl, new_decl).replace(old_hiter, new_hiter)
src_link = src_link.replace("// m escapes into the return value, but the caller of mapiterinit\n// doesn't let the return value escape.\n", "")
src_map = src_map.replace(old_iter, new_iter)
link.write_text(src_link)
umap.write_text(src_map)
print("patch-reflect2: patched", root)
