// W9 and W10 of the benchmarks: a Go program (built statically, CGO_ENABLED=0) that makes
// its own system calls for every file operation.
//
//	gofiles create DIR NDIRS NFILES   NDIRS directories of NFILES files each
//	gofiles rewrite DIR               rewrites every file under DIR (one level of dirs)
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: gofiles create DIR NDIRS NFILES | rewrite DIR")
		os.Exit(2)
	}
	data := []byte("written by gofiles: a line of text that stands for a small source file\n")
	switch os.Args[1] {
	case "create":
		dirs, err := strconv.Atoi(os.Args[3])
		must(err)
		files, err := strconv.Atoi(os.Args[4])
		must(err)
		for d := 0; d < dirs; d++ {
			dir := filepath.Join(os.Args[2], fmt.Sprintf("d%04d", d))
			must(os.MkdirAll(dir, 0o755))
			for f := 0; f < files; f++ {
				must(os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.txt", f)), data, 0o644))
			}
		}
	case "rewrite":
		dirs, err := os.ReadDir(os.Args[2])
		must(err)
		for _, d := range dirs {
			sub := filepath.Join(os.Args[2], d.Name())
			files, err := os.ReadDir(sub)
			must(err)
			for _, f := range files {
				must(os.WriteFile(filepath.Join(sub, f.Name()), data, 0o644))
			}
		}
	default:
		os.Exit(2)
	}
}
