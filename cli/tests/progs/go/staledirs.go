// Names that lead somewhere else a moment after they were used, each followed at once by a
// rewrite of a file that was there before: a directory renamed away and another renamed into
// its name, and the working directory changed. A supervisor that trusted what it remembers of
// a directory past such a change would capture the file the name no longer leads to, and undo
// could not put back the one that changed.
package main

import (
	"fmt"
	"os"
	"runtime"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	// One thread makes every call, so what the supervisor remembers of its working directory
	// is what it would use.
	runtime.LockOSThread()
	// Each step right after the last: well within the time a remembered directory is trusted.
	must(os.WriteFile("a/made", []byte("made in the first a\n"), 0o644))
	must(os.Rename("a", "a-away"))
	must(os.Rename("x", "a"))
	must(os.WriteFile("a/f", []byte("rewritten through the second a\n"), 0o644))
	// Names with a directory in them, from the working directory.
	must(os.Chdir("d1"))
	must(os.WriteFile("sub/g", []byte("made in d1/sub\n"), 0o644))
	must(os.Chdir("../d2"))
	must(os.WriteFile("sub/f", []byte("rewritten in d2/sub\n"), 0o644))
	d1, err := os.Open("../d1")
	must(err)
	must(d1.Chdir())
	must(os.WriteFile("sub/f", []byte("made in d1/sub after fchdir\n"), 0o644))
	must(d1.Close())
	fmt.Println("done")
}
