// Command benchtool is the data side of bench/run.sh: it turns dnsperf output and
// the readings the script takes (CPU ticks, RSS, connections, server counters)
// into one JSON record per run, and the records into bench/results/ (a markdown
// report, JSON and an SVG chart). It needs nothing beyond the Go standard library.
//
//	benchtool parse  -in dnsperf.out [-kv key=value ...]   one JSON record on stdout
//	benchtool median -in raw.jsonl -kind K -mode M -field F median of a field
//	benchtool report -in raw.jsonl -out DIR [-machine F] [-micro F] [-profile F]
//	benchtool regimes -in regimes.jsonl -out DIR [-machine F] [-label TEXT]
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "parse":
		err = parseCmd(os.Args[2:])
	case "median":
		err = medianCmd(os.Args[2:])
	case "report":
		err = reportCmd(os.Args[2:])
	case "regimes":
		err = regimesCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtool:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchtool parse|median|report|regimes [flags]")
	os.Exit(2)
}
