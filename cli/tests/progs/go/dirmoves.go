// Directories moved, removed and made again under the same names while files in them change,
// from the working directory and from directory descriptors: a supervisor that remembered
// where a name led would journal a file under the wrong directory.
package main

import (
	"fmt"
	"os"
	"syscall"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	for i := 0; i < 3; i++ {
		must(os.WriteFile("a/f", []byte(fmt.Sprintf("a/f, round %d\n", i)), 0o644))
		must(os.Rename("a", fmt.Sprintf("moved%d", i)))
		must(os.Mkdir("a", 0o755))
	}
	must(os.WriteFile("a/f", []byte("the last a/f\n"), 0o644))
	// A directory descriptor, its directory renamed, then the same number for another one.
	d, err := syscall.Open("b", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	must(err)
	fd, err := syscall.Openat(d, "g", syscall.O_WRONLY|syscall.O_TRUNC, 0)
	must(err)
	_, err = syscall.Write(fd, []byte("b/g by descriptor\n"))
	must(err)
	must(syscall.Close(fd))
	must(os.Rename("b", "b-moved"))
	must(os.Mkdir("b", 0o755))
	fd, err = syscall.Openat(d, "g", syscall.O_WRONLY|syscall.O_APPEND, 0)
	must(err)
	_, err = syscall.Write(fd, []byte("b-moved/g by descriptor\n"))
	must(err)
	must(syscall.Close(fd))
	must(syscall.Close(d))
	d2, err := syscall.Open("c", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	must(err)
	fd, err = syscall.Openat(d2, "g", syscall.O_WRONLY|syscall.O_TRUNC, 0)
	must(err)
	_, err = syscall.Write(fd, []byte("c/g by descriptor\n"))
	must(err)
	must(syscall.Close(fd))
	// The working directory moved under the program.
	must(os.Chdir("c"))
	must(os.Rename("../c", "../c-moved"))
	must(os.WriteFile("h", []byte("c-moved/h\n"), 0o644))
	must(os.Chdir(".."))
	must(os.RemoveAll("c-moved"))
	fmt.Println("done")
}
