// The file operations a Go program makes through its own system calls (Go never calls libc
// for them, even when it is linked with it): each kind the supervisor must journal.
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	must(os.WriteFile("written", []byte("written by go\n"), 0o644))
	must(os.WriteFile("existing", []byte("overwritten by go\n"), 0o644))
	f, err := os.OpenFile("appended", os.O_WRONLY|os.O_APPEND, 0)
	must(err)
	_, err = f.WriteString("appended by go\n")
	must(err)
	must(f.Close())
	must(os.Remove("removed"))
	must(os.Rename("renamed-from", "renamed-to"))
	must(os.Rename("replacing", "replaced"))
	must(os.RemoveAll("tree"))
	must(os.Chmod("chmodded", 0o600))
	must(os.MkdirAll(filepath.Join("made", "deep"), 0o755))
	must(os.WriteFile(filepath.Join("made", "deep", "file"), []byte("x"), 0o600))
	must(os.Symlink("written", "link"))
	must(os.Truncate("truncated", 3))
	fmt.Println("done")
}
