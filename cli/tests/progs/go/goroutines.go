// Many goroutines that compute while others change files: the runtime preempts them with
// SIGURG every 10 ms or so, which must not disturb (or endlessly restart) a watched call.
package main

import (
	"fmt"
	"os"
	"sync"
)

func main() {
	var wg sync.WaitGroup
	sums := make([]uint64, 64)
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var s uint64
			for i := 0; i < 20_000_000; i++ {
				s += uint64(i ^ g)
			}
			sums[g] = s
		}(g)
	}
	for i := 0; i < 400; i++ {
		name := fmt.Sprintf("f%03d", i)
		if err := os.WriteFile(name, []byte(name), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if i%2 == 0 {
			if err := os.Remove(name); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
	}
	wg.Wait()
	var total uint64
	for _, s := range sums {
		total += s
	}
	fmt.Println(total)
	os.Exit(3)
}
